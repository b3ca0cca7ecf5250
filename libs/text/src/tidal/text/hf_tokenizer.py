"""`HFTokenizer`: a Hugging Face model folder's tokenizer, without `transformers`.

`tokenizer.json` is loaded with `tokenizers` as is, so ids are the ones the model was
trained with, and only what `transformers` adds on top of it is reproduced: declared
added tokens at their ids (a mismatch is an error, not a silent shift), missing special
tokens, BOS/EOS flags when the file has no post-processor, and the EOS list (tokenizer
EOS, generation config, the template's end-of-turn token). `transformers` itself stays a
test reference: the orchestrator must not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as FastTokenizer
from tokenizers.processors import TemplateProcessing

from tidal.text.chat_template import (
    ChatEncoding,
    ChatTemplate,
    choose_template,
    templates_from_config,
)
from tidal.text.hf_folder import TokenizerFiles, TokenizerFolderError, read_tokenizer_files


class HFTokenizer(ChatEncoding):
    """The tokenizer of a local Hugging Face model folder (tokenizer.json + configs)."""

    def __init__(self, files: TokenizerFiles) -> None:
        self.files = files
        try:
            self._tok = FastTokenizer.from_file(str(files.tokenizer_json))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise TokenizerFolderError(f"{files.tokenizer_json} cannot be read: {e}") from e
        self._add_declared_tokens()
        self._specials = {n: self._id_of(n, s) for n, s in files.special_tokens.items()}
        if self._tok.post_processor is None:
            self._rebuild_post_processor(bool(files.add_bos_token), bool(files.add_eos_token))
        self._templates = templates_from_config(
            files.chat_template,
            origin=files.chat_template_origin,
            special_tokens=files.special_tokens,
        )
        added = {i: t for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self._special_ids = frozenset({*added, *self._specials.values()})
        template = self._templates.get("default")
        specials = [*(t.content for t in added.values()), *files.special_tokens.values()]
        self.end_of_turn_token = template.end_of_turn(specials) if template else None
        """The special token the default chat template closes a turn with, if any."""
        self._eos_ids = self._merge_eos()

    @classmethod
    def from_folder(cls, folder: str | Path) -> HFTokenizer:
        return cls(read_tokenizer_files(Path(folder)))

    # --- construction -------------------------------------------------------------

    def _add_declared_tokens(self) -> None:
        for token_id, fields in sorted(self.files.added_tokens.items()):
            content = fields.get("content")
            if not isinstance(content, str):
                raise TokenizerFolderError(f"added token {token_id} has no content: {fields!r}")
            existing = self._tok.token_to_id(content)
            if existing is None:
                token = AddedToken(
                    content,
                    single_word=bool(fields.get("single_word", False)),
                    lstrip=bool(fields.get("lstrip", False)),
                    rstrip=bool(fields.get("rstrip", False)),
                    normalized=bool(fields.get("normalized", not fields.get("special", False))),
                    special=bool(fields.get("special", False)),
                )
                self._tok.add_tokens([token])
                existing = self._tok.token_to_id(content)
            if existing != token_id:
                raise TokenizerFolderError(
                    f"{self.files.folder}: tokenizer_config.json puts {content!r} at id {token_id} "
                    f"but tokenizer.json gives it id {existing}"
                )

    def _id_of(self, name: str, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:  # transformers adds a named special token the vocab lacks
            self._tok.add_special_tokens([AddedToken(token, special=True, normalized=False)])
            token_id = self._tok.token_to_id(token)
        assert token_id is not None, f"{name} {token!r} could not be added"
        return token_id

    def _rebuild_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """BOS/EOS around each sequence as the flags ask (tokenizers' TemplateProcessing)."""
        bos = self.files.special_tokens.get("bos_token") if add_bos else None
        eos = self.files.special_tokens.get("eos_token") if add_eos else None

        def sequence(name: str, type_id: int) -> str:
            parts = [f"{bos}:{type_id}"] if bos else []
            return " ".join([*parts, f"${name}:{type_id}", *([f"{eos}:{type_id}"] if eos else [])])

        special = [(t, self._specials[n]) for n, t in (("bos_token", bos), ("eos_token", eos)) if t]
        self._tok.post_processor = TemplateProcessing(
            single=sequence("A", 0),
            pair=f"{sequence('A', 0)} {sequence('B', 1)}",
            special_tokens=special,
        )

    def _merge_eos(self) -> tuple[int, ...]:
        candidates: list[int] = []
        if "eos_token" in self._specials:
            candidates.append(self._specials["eos_token"])
        candidates.extend(self.files.generation_eos_ids)
        eot = self.end_of_turn_token
        if eot is not None:
            candidates.append(self._id_of("end of turn", eot))
        merged = tuple(dict.fromkeys(candidates))
        if not merged:
            raise TokenizerFolderError(
                f"{self.files.folder} names no end-of-sequence token: set eos_token in "
                "tokenizer_config.json or eos_token_id in generation_config.json"
            )
        return merged

    # --- the Tokenizer interface --------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.files.folder)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_id(self) -> int | None:
        return self._specials.get("bos_token")

    @property
    def eos_id(self) -> int:
        return self._eos_ids[0]

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    @property
    def pad_id(self) -> int:
        return self._specials.get("pad_token", self.eos_id)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_template_text(self, text: str) -> list[int]:
        return self.encode(text, add_special_tokens=False)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special))

    def chat_template(self, *, tools: object = None) -> ChatTemplate:
        return choose_template(self._templates, tools=tools, origin=str(self.files.folder))

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.files.folder)!r}, vocab_size={self.vocab_size})"
