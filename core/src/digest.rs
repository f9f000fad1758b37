//! Digests the core needs (card entity tags; later, stored credential hashes).

use sha2::{Digest, Sha256};

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}
