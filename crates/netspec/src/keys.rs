//! WireGuard's X25519 keys in their text form (base64 of 32 bytes, as `wg genkey` and
//! `wg pubkey` print them).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::SpecError;

/// The 32 bytes of a base64 key; `field` names it in the error.
pub fn decode_key(field: &'static str, text: &str) -> Result<[u8; 32], SpecError> {
    let bytes = B64
        .decode(text.trim())
        .map_err(|e| SpecError::new(field, format!("not base64: {e}")))?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        SpecError::new(field, format!("decodes to {} bytes, want 32", b.len()))
    })
}

/// The base64 form of a key.
pub fn encode_key(bytes: &[u8; 32]) -> String {
    B64.encode(bytes)
}

/// A new random private key, base64 (like `wg genkey`).
pub fn generate_private_key() -> String {
    let bytes: [u8; 32] = rand::random();
    encode_key(&StaticSecret::from(bytes).to_bytes())
}

/// The public key of a base64 private key (like `wg pubkey`).
pub fn public_key(private_key: &str) -> Result<String, SpecError> {
    let secret = StaticSecret::from(decode_key("privateKey", private_key)?);
    Ok(encode_key(PublicKey::from(&secret).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_key_matches_known_vector() {
        // RFC 7748 §6.1: Alice's private and public key.
        let private = B64.encode([
            0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2,
            0x66, 0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5,
            0x1d, 0xb9, 0x2c, 0x2a,
        ]);
        let public = B64.encode([
            0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d, 0xdc, 0xb4, 0x3e,
            0xf7, 0x5a, 0x0d, 0xbf, 0x3a, 0x0d, 0x26, 0x38, 0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e,
            0xaa, 0x9b, 0x4e, 0x6a,
        ]);
        assert_eq!(public_key(&private).unwrap(), public);
    }

    #[test]
    fn keys_refuse_what_is_not_32_bytes_of_base64() {
        let short = public_key("YWJj").unwrap_err().to_string();
        assert!(
            short.contains("privateKey: decodes to 3 bytes, want 32"),
            "{short}"
        );
        let garbage = public_key("***").unwrap_err().to_string();
        assert!(garbage.contains("privateKey: not base64"), "{garbage}");
        let fresh = generate_private_key();
        assert_ne!(fresh, generate_private_key(), "keys are random");
        assert_eq!(
            decode_key("k", &fresh).map(|b| encode_key(&b)).unwrap(),
            fresh
        );
    }
}
