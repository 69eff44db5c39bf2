"""A peer's identity: one RSA key that is both its libp2p identity and its DHT signing key.

Using one key for both is what makes records unspoofable. A record is stored under a subkey
that embeds the owner's public key, hivemind's RSASignatureValidator makes every DHT node
refuse changes to it not signed by that key, and readers check that the peer id inside the
record is the one derived from that same public key (libp2p peer id = multihash of the key).
So nobody can write a record that claims another peer's id, or change another peer's record.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey


@dataclass(frozen=True)
class Identity:
    identity_path: Path  # the libp2p identity file handed to p2pd
    private_key: RSAPrivateKey
    peer_id: PeerID

    @property
    def owner_marker(self) -> bytes:
        """The `[owner:<public key>]` string that protects this peer's DHT subkeys."""
        return RSASignatureValidator(self.private_key).local_public_key


def load_or_create_identity(path: str | Path | None) -> Identity:
    """Loads the identity file at `path`, creating it first if it does not exist.

    With no path, a fresh identity lives in a temporary file (a new peer id every start).
    """
    if path is None:
        directory = tempfile.mkdtemp(prefix="hexswarm-id-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)  # p2pd reads it only at start
        path = Path(directory) / "identity.key"
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))
    data = path.read_bytes()
    try:
        key_proto = crypto_pb2.PrivateKey.FromString(data)
        if key_proto.key_type != crypto_pb2.KeyType.RSA:
            raise ValueError("only RSA identities are supported")
        private_key = _rsa_key_from_der(key_proto.data)
    except Exception as e:
        raise ValueError(f"{path} is not a hexswarm/hivemind RSA identity file: {e}") from None
    return Identity(identity_path=path, private_key=private_key, peer_id=PeerID.from_identity(data))


def _rsa_key_from_der(der: bytes) -> RSAPrivateKey:
    # hivemind's RSAPrivateKey has no from_bytes; its pickling hook is the supported way in.
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": der})
    return key


def peer_id_from_owner_marker(owner_marker: bytes) -> PeerID:
    """The libp2p peer id of the key inside an `[owner:ssh-rsa ...]` marker."""
    match = RSASignatureValidator._PUBLIC_KEY_RE.fullmatch(owner_marker)
    if match is None:
        raise ValueError("not an owner marker")
    public_key = RSAPublicKey.from_bytes(match.group(1))._public_key
    der = public_key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return PeerID.from_base58(_peer_id_base58(encoded))


def _peer_id_base58(encoded_public_key: bytes) -> str:
    # libp2p: keys longer than 42 bytes are identified by their sha2-256 multihash (0x12, 32 bytes).
    digest = hashlib.sha256(encoded_public_key).digest()
    return base58.b58encode(bytes([0x12, 32]) + digest).decode()
