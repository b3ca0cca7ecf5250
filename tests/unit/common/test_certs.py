"""Run certificates (tidal.common.security.credentials) and tokens: what `tidal rl` and `tidal
certs`
write, with which permissions, and that a run folder keeps its identities on resume."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography import x509

from tidal.cli.launcher import prepare_run_dir
from tidal.common.files.modes import apply_file_policy
from tidal.common.security.credentials import (
    ROLES,
    VERIFIERS_FILE,
    ensure_certificates,
    ensure_tokens,
    role_of_certificate,
    token_digest,
)

from ..cli.test_run_dir import run_config


def test_each_role_gets_a_ca_signed_leaf_carrying_its_role_and_hosts(tmp_path: Path) -> None:
    assert ensure_certificates(tmp_path, ["trainer", "10.0.0.5"]) == list(ROLES)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    for role in ROLES:
        pem = (tmp_path / f"{role}.pem").read_bytes()
        assert role_of_certificate(pem) == role
        leaf = x509.load_pem_x509_certificate(pem)
        leaf.verify_directly_issued_by(ca)
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {"localhost", "trainer"} <= set(san.get_values_for_type(x509.DNSName))
        assert stat.S_IMODE((tmp_path / f"{role}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert ensure_certificates(tmp_path) == []  # all present: nothing rewritten


def test_a_ca_without_its_key_cannot_sign_missing_leaves(tmp_path: Path) -> None:
    ensure_certificates(tmp_path)
    (tmp_path / "ca.key").unlink()
    (tmp_path / "trainer.pem").unlink()
    with pytest.raises(ValueError, match=r"ca\.pem exists without ca\.key"):
        ensure_certificates(tmp_path)


def test_tokens_are_per_role_and_servers_keep_only_digests(tmp_path: Path) -> None:
    assert ensure_tokens(tmp_path) == list(ROLES)
    tokens = {r: (tmp_path / f"{r}.token").read_text().strip() for r in ROLES}
    assert len(set(tokens.values())) == len(ROLES)
    assert all(t.startswith(f"{r}.") for r, t in tokens.items())
    verifiers = json.loads((tmp_path / VERIFIERS_FILE).read_text())
    assert verifiers == {r: token_digest(t) for r, t in tokens.items()}
    assert not set(tokens.values()) & set(verifiers.values())


def test_tidal_rl_makes_the_run_certificates_and_resume_keeps_them(tmp_path: Path) -> None:
    run_dir = prepare_run_dir(run_config(tmp_path))
    trainer_pem = (run_dir / "tls" / "trainer.pem").read_bytes()
    (run_dir / "checkpoints" / "step_00000001").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000001" / ".metadata").write_bytes(b"dcp")
    prepare_run_dir(run_config(tmp_path), resume=True)
    assert (run_dir / "tls" / "trainer.pem").read_bytes() == trainer_pem
    assert stat.S_IMODE((run_dir / "tls").stat().st_mode) == 0o700


def test_certs_leave_an_existing_shared_folder_mode_unchanged(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    ensure_certificates(shared)
    ensure_tokens(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "ca.key").stat().st_mode) == 0o600


def test_certs_create_missing_folders_0700(tmp_path: Path) -> None:
    apply_file_policy(shared_readable=True)  # the key folder is private whatever the policy
    ensure_certificates(tmp_path / "new" / "tls")
    ensure_tokens(tmp_path / "new" / "tls")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "tls").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "tls" / "trainer.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new" / "tls" / "trainer.token").stat().st_mode) == 0o600


def test_certificates_and_token_digests_follow_the_file_policy(tmp_path: Path) -> None:
    for shared_readable, public in ((False, 0o600), (True, 0o644)):
        apply_file_policy(shared_readable=shared_readable)
        folder = tmp_path / str(shared_readable)
        ensure_certificates(folder)
        ensure_tokens(folder)
        for name in ("ca.pem", "trainer.pem", VERIFIERS_FILE):
            assert stat.S_IMODE((folder / name).stat().st_mode) == public, name
        assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
