"""tlsfiles - a throwaway certificate authority for the TLS tests.

Every TLS test makes its own CA in a temporary directory, so nothing depends
on the machine's store or on files that expire. Keys are ECDSA P-256 (fast
to make). Uses python3-cryptography (Debian's package).

    ca = TestCA(directory)                       # ca.cert: the CA's PEM file
    cert, key = ca.issue("server", dns=["localhost"], ips=["127.0.0.1"])
    cert, key = ca.issue("alice", cn="alice", client=True)
    cert, key = ca.issue("old", dns=["localhost"], days=(-10, -1))  # expired
    other = TestCA(directory, "other CA")        # a CA nobody trusts

issue() writes NAME.crt and NAME.key beside the CA and returns their paths.
"""

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write_key(path, key):
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.chmod(path, 0o600)


def _write_cert(path, cert):
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


class TestCA:
    """A certificate authority whose files live in `directory`."""

    def __init__(self, directory, name="beangate test CA"):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        slug = name.replace(" ", "_")
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(self.name).issuer_name(self.name)
                .public_key(self.key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert = os.path.join(directory, slug + "-ca.crt")
        _write_cert(self.cert, cert)

    # Issue a leaf certificate: NAME.crt and NAME.key in the CA's directory.
    # dns/ips/emails/uris become subjectAltNames; cn the subject's common
    # name (default: none when a SAN is given, else NAME); days the validity
    # as (start, end) in days from now; client: for TLS client auth too.
    def issue(self, name, dns=(), ips=(), emails=(), uris=(), cn=None, days=(-1, 30), client=False):
        key = ec.generate_private_key(ec.SECP256R1())
        if cn is None and not (dns or ips or emails or uris):
            cn = name
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(subject).issuer_name(self.name)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now + datetime.timedelta(days=days[0]))
                   .not_valid_after(now + datetime.timedelta(days=days[1]))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        sans = ([x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips] +
                [x509.RFC822Name(e) for e in emails] +
                [x509.UniformResourceIdentifier(u) for u in uris])
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=not cn)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path = os.path.join(self.directory, name + ".crt")
        key_path = os.path.join(self.directory, name + ".key")
        _write_cert(cert_path, cert)
        _write_key(key_path, key)
        return cert_path, key_path
