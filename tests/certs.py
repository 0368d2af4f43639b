"""A private CA and the certificates it signs, made with the openssl CLI, for TLS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class TestCa:
    """A CA in ``directory`` (``ca.crt``); ``issue`` makes a certificate it signed."""

    __test__ = False  # not a test class, whatever pytest's name pattern says

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.directory = directory
        self.cert, self.key = directory / f"{name}.crt", directory / f"{name}.key"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", f"/CN=Test CA {name}", "-keyout", str(self.key), "-out",
                 str(self.cert))

    def issue(self, name: str, alt_names: str = "IP:127.0.0.1,DNS:localhost"
              ) -> tuple[Path, Path]:
        """A certificate (for ``alt_names``; usable as a server's and a client's) and its
        key, signed by this CA."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        csr, ext = self.directory / f"{name}.csr", self.directory / f"{name}.ext"
        ext.write_text(f"subjectAltName={alt_names}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(key), "-out", str(csr))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey",
                 str(self.key), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
                 "-out", str(cert))
        return cert, key
