//! FNV-1a, 64 bits: tiny, stable across platforms and releases (unlike
//! std's `DefaultHasher`), good enough to tell replicas, snapshots or two
//! reads of one resource apart. Not a cryptographic hash.

/// A running FNV-1a (64-bit) hash.
pub struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// An empty hash (the FNV offset basis).
    pub fn new() -> Self {
        Fnv1a(Self::OFFSET_BASIS)
    }

    /// Mixes `bytes` into the hash.
    pub fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// Writes the length first, so that concatenations cannot collide.
    pub fn write_framed(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// The hash of everything written so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// A stable hash of `value`'s encoding: equal values have equal digests on
/// every node and release (what a long poll compares to tell a change).
/// A value that does not encode digests to 0 (every such value looks the
/// same; the types this is used for always encode).
pub fn of<T: serde::Serialize>(value: &T) -> u64 {
    let mut hash = Fnv1a::new();
    match postcard::to_allocvec(value) {
        Ok(bytes) => hash.write(&bytes),
        Err(_) => return 0,
    }
    hash.finish()
}

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_test_vectors() {
        let digest = |bytes: &[u8]| {
            let mut h = Fnv1a::new();
            h.write(bytes);
            h.finish()
        };
        assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
