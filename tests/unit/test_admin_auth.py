"""The admin console's auth file (PgBouncer's userlist.txt format) and the checks a start and a reload make."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from proxy.config import ConfigError, parse_config
from proxy.serve.admin import check_auth, load_auth_file, scram_secret


def test_auth_file_format(tmp_path):
    path = tmp_path / "users.txt"
    path.write_text('; a comment\n# another\n\n"ops" "pw"\n  "q""uote" "a ""b"""  trailing\n')
    assert load_auth_file(str(path)) == {"ops": "pw", 'q"uote': 'a "b"'}
    path.write_text('"ops" "pw"\nops pw\n')
    with pytest.raises(ConfigError, match=r'users.txt:2: expected "user" "secret"'):
        load_auth_file(str(path))


def test_scram_secret_is_postgresqls_format():
    salt = b"0123456789abcdef"
    secret = scram_secret("pencil", salt=salt, iterations=4096)
    iterations, salt_b64, stored_b64, server_b64 = secret.replace("SCRAM-SHA-256$", "").replace("$", ":").split(":")
    assert iterations == "4096" and base64.b64decode(salt_b64) == salt
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    assert base64.b64decode(stored_b64) == hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    assert base64.b64decode(server_b64) == hmac.digest(salted, b"Server Key", "sha256")


def _config(tmp_path, lines: list[str], users: list[str], auth: str = "scram-sha-256"):
    path = tmp_path / "users.txt"
    path.write_text("\n".join(lines) + "\n")
    return parse_config({"admin": {"listen": "127.0.0.1:6434", "users": users, "auth_file": str(path),
                                   "auth": auth}})


def test_check_auth(tmp_path):
    md5 = "md5" + hashlib.md5(b"pwops").hexdigest()
    ok = _config(tmp_path, ['"ops" "pw"', '"other" "x"'], ["ops"])
    assert check_auth(ok) == {"ops": "pw"}  # only the admin users' secrets are kept
    assert check_auth(_config(tmp_path, [f'"ops" "{md5}"'], ["ops"], auth="md5")) == {"ops": md5}
    for lines, users, auth, why in (
            (['"ops" "pw"'], ["ops", "missing"], "scram-sha-256", "'missing' has no line in admin.auth_file"),
            ([f'"ops" "{md5}"'], ["ops"], "scram-sha-256", "md5 hash, which cannot answer scram-sha-256"),
            (['"ops" "SCRAM-SHA-256$4096:xx"'], ["ops"], "scram-sha-256", "secret of 'ops' is malformed")):
        with pytest.raises(ConfigError, match=why):
            check_auth(_config(tmp_path, lines, users, auth))
