//! Identifiers. The core owns no source of randomness: the driver supplies one from the OS
//! ([`Entropy`]), and the core formats what it draws.

/// A source of unpredictable bytes, supplied by the driver (the OS's `getrandom`).
pub trait Entropy: Send {
    /// Fills all of `buf` with unpredictable bytes. There is no error: a source that cannot
    /// deliver must stop (panic) rather than let the core mint guessable identifiers.
    fn fill(&mut self, buf: &mut [u8]);
}

/// Deterministic bytes for tests and fuzzing: a counter run through SplitMix64. Never use it
/// where identifiers must be unguessable.
#[derive(Clone, Debug, Default)]
pub struct CounterEntropy(pub u64);

impl Entropy for CounterEntropy {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// A random (version 4) UUID in its hyphenated lower-case form.
pub fn uuid_v4(entropy: &mut dyn Entropy) -> String {
    let mut b = [0u8; 16];
    entropy.fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from(HEX[usize::from(byte >> 4)]));
        s.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    s
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        s.push(char::from(HEX[usize::from(byte >> 4)]));
        s.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_has_version_and_variant_bits() {
        let mut e = CounterEntropy(7);
        let a = uuid_v4(&mut e);
        let b = uuid_v4(&mut e);
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
        assert_eq!(a.matches('-').count(), 4);
    }
}
