//! Encryption at rest of a volume: AES-256 in XTS mode (IEEE 1619), each
//! 4 KiB block of the volume a data unit whose tweak is its block number in
//! the volume, from RustCrypto's `aes` and `xts-mode`.
//!
//! The front end encrypts a write before it leaves the node and decrypts a
//! read after it arrives, so replicas, devices and the wire carry only
//! ciphertext. The key (512 bits: XTS's two AES-256 keys; its bytes and
//! expanded round keys are wiped when dropped) is the user's: it
//! lives in a key file (128 hex digits, mode 0600), goes to a node's memory
//! when the volume is unlocked there, and never into the Raft log or any
//! message between nodes. The map holds only its check value
//! ([`VolumeKey::check`]), so a node refuses a wrong key at unlock.

use aes::cipher::{generic_array::GenericArray, KeyInit};
use aes::Aes256;
use xts_mode::Xts128;

/// Bytes of a volume key: XTS-AES-256's two 256-bit keys.
pub const KEY_BYTES: usize = 64;
/// A volume's data unit: weir's block.
pub const UNIT: usize = 4096;
/// The data unit whose encryption of zeroes makes the key's check value: past
/// any block of a volume (block numbers stay below 2^52).
const CHECK_UNIT: u128 = u128::MAX;

/// Why a key was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not 128 hex digits.
    #[error("a volume key is {} hex digits (512 bits)", 2 * KEY_BYTES)]
    Malformed,
    /// The key is not the volume's (its check value differs).
    #[error("this is not the key volume {0:?} was created with")]
    Wrong(String),
}

/// A volume's key, ready to encrypt and decrypt its blocks.
pub struct VolumeKey {
    xts: Xts128<Aes256>,
}

impl std::fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VolumeKey(..)")
    }
}

/// Two keys are the same key when their check values are (a 512-bit key
/// and a 128-bit check: a different key with the same check is not found by
/// chance).
impl PartialEq for VolumeKey {
    fn eq(&self, other: &VolumeKey) -> bool {
        self.check() == other.check()
    }
}

impl Eq for VolumeKey {}

impl VolumeKey {
    /// The key of `hex` (128 hex digits, surrounding whitespace ignored).
    pub fn from_hex(hex: &str) -> Result<VolumeKey, KeyError> {
        let hex = hex.trim();
        if hex.len() != 2 * KEY_BYTES || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError::Malformed);
        }
        let mut bytes = zeroize::Zeroizing::new([0u8; KEY_BYTES]);
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte =
                u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| KeyError::Malformed)?;
        }
        Ok(VolumeKey::from_bytes(&bytes))
    }

    /// The key of 64 bytes.
    pub fn from_bytes(key: &[u8; KEY_BYTES]) -> VolumeKey {
        let (k1, k2) = key.split_at(KEY_BYTES / 2);
        let c1 = Aes256::new(GenericArray::from_slice(k1));
        let c2 = Aes256::new(GenericArray::from_slice(k2));
        VolumeKey {
            xts: Xts128::new(c1, c2),
        }
    }

    /// The key's check value: the first 16 bytes of a unit of zeroes
    /// encrypted as a unit no volume has. It tells a wrong key from the
    /// right one and, for a random 512-bit key, nothing more.
    pub fn check(&self) -> [u8; 16] {
        let mut unit = [0u8; UNIT];
        self.xts.encrypt_sector(&mut unit, CHECK_UNIT.to_le_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&unit[..16]);
        out
    }

    /// This key, if its check value is `check` (volume `name`'s).
    pub fn verified(self, check: &[u8; 16], name: &str) -> Result<VolumeKey, KeyError> {
        if &self.check() == check {
            Ok(self)
        } else {
            Err(KeyError::Wrong(name.to_string()))
        }
    }

    /// Encrypt whole blocks in place, the first being block `first` of the
    /// volume.
    pub fn encrypt(&self, blocks: &mut [u8], first: u64) {
        debug_assert!(blocks.len().is_multiple_of(UNIT), "whole blocks");
        self.xts
            .encrypt_area(blocks, UNIT, u128::from(first), |n| n.to_le_bytes());
    }

    /// Decrypt whole blocks in place, the first being block `first`.
    pub fn decrypt(&self, blocks: &mut [u8], first: u64) {
        debug_assert!(blocks.len().is_multiple_of(UNIT), "whole blocks");
        self.xts
            .decrypt_area(blocks, UNIT, u128::from(first), |n| n.to_le_bytes());
    }
}

/// `check` as hex, and back (the admin API carries it in a query).
pub fn check_hex(check: &[u8; 16]) -> String {
    check.iter().map(|b| format!("{b:02x}")).collect()
}

/// A check value from 32 hex digits.
pub fn check_from_hex(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> VolumeKey {
        VolumeKey::from_bytes(&[seed; KEY_BYTES])
    }

    #[test]
    fn blocks_round_trip_and_each_block_number_encrypts_differently() {
        let k = key(7);
        let plain: Vec<u8> = (0..3 * UNIT).map(|i| (i % 251) as u8).collect();
        let mut data = plain.clone();
        k.encrypt(&mut data, 10);
        assert_ne!(data, plain);
        // The same plaintext in two blocks: two different ciphertexts.
        let mut same = vec![0xab; 2 * UNIT];
        k.encrypt(&mut same, 0);
        assert_ne!(same[..UNIT], same[UNIT..]);
        // Block by block equals all at once: the tweak is the block number.
        let mut one = plain[UNIT..2 * UNIT].to_vec();
        k.encrypt(&mut one, 11);
        assert_eq!(one, data[UNIT..2 * UNIT]);
        k.decrypt(&mut data, 10);
        assert_eq!(data, plain);
        // Another key reads noise.
        let mut other = plain.clone();
        k.encrypt(&mut other, 10);
        key(8).decrypt(&mut other, 10);
        assert_ne!(other, plain);
    }

    #[test]
    fn known_answer_of_ieee_1619_vector_10() {
        // IEEE 1619-2007, XTS-AES-256, vector 10: key1 = 2718281828...,
        // key2 = 3141592653..., data unit 0xff, 512 bytes of 00..ff twice.
        let key1 = "2718281828459045235360287471352662497757247093699959574966967627";
        let key2 = "3141592653589793238462643383279502884197169399375105820974944592";
        let k = VolumeKey::from_hex(&format!("{key1}{key2}")).unwrap();
        let mut unit: Vec<u8> = (0..512).map(|i| (i % 256) as u8).collect();
        k.xts.encrypt_sector(&mut unit, 0xffu128.to_le_bytes());
        let want = "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b";
        assert_eq!(check_hex(&unit[..16].try_into().unwrap()), want[..32]);
        assert_eq!(check_hex(&unit[16..32].try_into().unwrap()), want[32..]);
    }

    #[test]
    fn keys_are_checked_by_their_check_value_and_bad_hex_is_refused() {
        let k = key(1);
        let check = k.check();
        assert_eq!(check_from_hex(&check_hex(&check)), Some(check));
        assert!(key(1).verified(&check, "v").is_ok());
        assert_eq!(
            key(2).verified(&check, "v").unwrap_err(),
            KeyError::Wrong("v".into())
        );
        for bad in ["", "00", &"g".repeat(128), &"0".repeat(127)] {
            assert_eq!(VolumeKey::from_hex(bad).unwrap_err(), KeyError::Malformed);
        }
        assert!(VolumeKey::from_hex(&format!("{}\n", "a".repeat(128))).is_ok());
        assert_eq!(check_from_hex("zz"), None);
    }
}
