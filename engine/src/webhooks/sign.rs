//! Standard Webhooks signing: a secret is `whsec_` and the base64 of 32 random bytes; a
//! signature is `v1,` and the base64 of HMAC-SHA256 under those bytes of
//! `{webhook-id}.{webhook-timestamp}.{body}`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh signing secret, shown to its creator once.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The `webhook-signature` header of one attempt; `None` for a secret not of our form.
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let raw = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .ok()?;
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &raw);
    let mut context = aws_lc_rs::hmac::Context::with_key(&key);
    context.update(id.as_bytes());
    context.update(b".");
    context.update(timestamp.to_string().as_bytes());
    context.update(b".");
    context.update(body);
    Some(format!("v1,{}", STANDARD.encode(context.sign().as_ref())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The example of the Standard Webhooks specification's reference libraries.
    #[test]
    fn signs_as_the_reference_libraries_do() {
        let got = signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            got.as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }

    #[test]
    fn secrets_are_fresh_and_of_the_standard_form() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        let raw = STANDARD
            .decode(a.strip_prefix(SECRET_PREFIX).unwrap())
            .unwrap();
        assert_eq!(raw.len(), 32);
    }
}
