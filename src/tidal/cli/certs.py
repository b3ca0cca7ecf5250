"""The credentials `tidal rl` makes for a run (`tidal certs` itself:
tidal.common.security.credentials)."""

from __future__ import annotations

from tidal.common.config.shared import SharedConfig
from tidal.common.errors import ConfigError
from tidal.common.security.credentials import ensure_certificates, ensure_tokens


def ensure_run_credentials(config: SharedConfig) -> list[str]:
    """Create the certificates (and tokens in token mode) a run needs when missing, in
    `security.tls_dir` or `<run dir>/tls`; existing ones are reused (a resumed run).
    Returns what was created, for the launcher's message."""
    security = config.security
    if security.mode == "plaintext":
        return []
    for key in ("cert", "key", "token_file", "token_env"):
        if getattr(security, key) is not None:
            raise ConfigError(
                f"security.{key} names one process's credential, but `tidal rl` runs every "
                f"role: unset it and put each role's files in security.tls_dir (<role>.pem, "
                "<role>.key, <role>.token)"
            )
    folder = security.folder(config.run.dir)
    created = ensure_certificates(folder, security.hosts, name=config.run.name)
    if security.mode == "token":
        created += [f"{role} token" for role in ensure_tokens(folder)]
    return created
