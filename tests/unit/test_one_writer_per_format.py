"""One writer per file format, read from the source: safetensors files are written only by
`tidal.models.safetensors_format`, Hugging Face model folders only by `tidal.models.hf_folder`
(published versions, exports, final weights and checkpoints take their files from there).

Every module under `services/*/src`, `libs/*/src` and `src/` is scanned line by line. Calls
are looked for in the code with strings and comments blanked (an error message may tell the
user to run `save_pretrained`); file names and modes in the whole line, since they are
strings. A hit names the file and line.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [*ROOT.glob("services/*/src"), *ROOT.glob("libs/*/src"), ROOT / "src"]
MODELS = ROOT / "libs/models/src/tidal/models"
SAFETENSORS_WRITER = MODELS / "safetensors_format.py"
FOLDER_WRITER = MODELS / "hf_folder.py"

SAFETENSORS_CALLS = re.compile(
    r"\bsave_file\(|\bsave_model\(|(?<!tokenizer)\.save_pretrained\(|safetensors\.torch\.save"
    r"|from safetensors\.torch import .*\bsave(_file|_model)?\b"
)
"""safetensors' and transformers' own writers. A tokenizer's `save_pretrained` into a
scratch folder is transformers serializing its own files, which then reach the model folder
through `write_folder` as extra files; it writes no weights."""
SAFETENSORS_HEADER = re.compile(r"__metadata__|data_offsets")
"""What an encoder of our own spells out."""
FILE_WRITE = re.compile(
    r"\.write_(text|bytes)\(|\bwrite_(hashed|atomic)\(|json\.dump\(|open\(.*\"[wax]"
)
FOLDER_FILE = re.compile(
    r"config\.json|\.safetensors|tokenizer|\b(CONFIG|CONFIG_FILE|MODEL_CONFIG|WEIGHTS_FILE"
    r"|SINGLE|INDEX|GENERATION_CONFIG|TOKENIZER_\w+|SPECIAL_TOKENS_MAP|CHAT_TEMPLATE_JINJA)\b"
)
"""A model folder's files, by name or by the constant that names them."""
CONFIG_JSON = re.compile(r"json\.dumps?\((hf_)?config\b")
"""config.json's text made outside the writer."""


def code_lines(text: str) -> list[str]:
    """The file's lines with strings and comments blanked out."""
    lines = text.splitlines()
    skip = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in skip:
            (first, begin), (last, end) = token.start, token.end
            for row in range(first - 1, last):
                line = lines[row]
                start, stop = (
                    begin if row == first - 1 else 0,
                    end if row == last - 1 else len(line),
                )
                lines[row] = line[:start] + " " * (stop - start) + line[stop:]
    return lines


def offenders(path: Path, root: Path = ROOT) -> list[str]:
    """`path:line: text` of each line that writes a format outside its writer."""
    text = path.read_text()
    found = []
    for number, (line, code) in enumerate(zip(text.splitlines(), code_lines(text), strict=True), 1):
        safetensors = SAFETENSORS_CALLS.search(code) or SAFETENSORS_HEADER.search(line)
        folder = (FILE_WRITE.search(line) and FOLDER_FILE.search(line)) or CONFIG_JSON.search(code)
        if (safetensors and path != SAFETENSORS_WRITER) or (folder and path != FOLDER_WRITER):
            found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_safetensors_files_and_model_folders_each_have_one_writer() -> None:
    found = [hit for src in SOURCE_ROOTS for path in src.rglob("*.py") for hit in offenders(path)]
    assert found == [], (
        "write safetensors through tidal.models.safetensors_format and model folders through "
        "tidal.models.hf_folder (folder_files / write_folder):\n" + "\n".join(found)
    )


def test_the_scan_finds_planted_writers_and_spares_messages(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from safetensors.torch import save_file\n"
        "raise ValueError('run `tok.save_pretrained(folder)` to write it')  # save_file(x)\n"
        "model.save_pretrained(out)\n"
        '(folder / "config.json").write_text(text)\n'
        "(folder / GENERATION_CONFIG).write_bytes(data)\n"
        "data = json.dumps(hf_config)\n"
        'header = {"__metadata__": {}}\n'
        '(run_dir / "config.toml").write_text(toml)\n'
    )
    hits = [hit.split(":")[1] for hit in offenders(planted, tmp_path)]
    assert hits == ["1", "3", "4", "5", "6", "7"]
