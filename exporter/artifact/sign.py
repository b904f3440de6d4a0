"""Offline signing with the OpenSSF model-signing library: an elliptic-curve key pair, no network.

``model.sig`` (a Sigstore bundle) sits beside the files it covers: every file of the folder but
itself, by path and sha256, so a changed, added or removed file fails the check as much as a
signature made with another key.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ArtifactError

SIGNATURE = "model.sig"


def _hashing(folder: Path):  # type: ignore[no-untyped-def]
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False)


def _check_key(key: Path) -> None:
    if not key.is_file():
        raise ArtifactError(key, "key file not found")


def sign_artifact(folder: Path, private_key: Path) -> Path:
    """Write ``folder/model.sig``; replaces an older signature atomically."""
    from model_signing import signing

    _check_key(private_key)
    out = folder / SIGNATURE
    tmp = folder / f".{SIGNATURE}.tmp-{os.getpid()}"
    try:
        config = signing.Config().use_elliptic_key_signer(private_key=private_key)
        config.set_hashing_config(_hashing(folder)).sign(folder, tmp)
    except Exception as e:  # the library raises ValueError/TypeError etc. for unusable keys
        tmp.unlink(missing_ok=True)
        raise ArtifactError(private_key, f"cannot sign with this key ({type(e).__name__}: {e})") from e
    os.replace(tmp, out)
    return out


def signature_problem(folder: Path, public_key: Path) -> str | None:
    """Why ``model.sig`` does not prove the folder's content under ``public_key``, or None."""
    from model_signing import verifying

    _check_key(public_key)
    signature = folder / SIGNATURE
    if not signature.is_file():
        return f"{SIGNATURE} missing (the folder is not signed)"
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
        config.set_hashing_config(_hashing(folder)).verify(folder, signature)
    except Exception as e:  # tampering and wrong keys surface as ValueError and friends
        return f"signature check failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None
