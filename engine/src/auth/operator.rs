//! The platform operator's bearer (L1): `BRAIN_OPERATOR_TOKEN`, which alone reaches the
//! team API (`/v1/teams`). It is no team's key: it opens nothing else, and a team's key
//! or token never opens the team API. Kept as its SHA-256 digest and compared in
//! constant time; never logged (its `Debug` shows nothing of it).

use sha2::{Digest, Sha256};

use envcfg::{ConfigError, Env, non_empty};

/// The shortest token accepted: 32 characters, so it cannot be guessed either.
const MIN_CHARS: usize = 32;

#[derive(Clone)]
pub struct OperatorToken([u8; 32]);

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(..)")
    }
}

impl OperatorToken {
    /// `BRAIN_OPERATOR_TOKEN`; unset, the team API is off.
    pub fn from_env(env: &dyn Env) -> Result<Option<Self>, ConfigError> {
        let Some(raw) = non_empty(env, "BRAIN_OPERATOR_TOKEN") else {
            return Ok(None);
        };
        if raw.chars().count() < MIN_CHARS || raw.chars().any(char::is_whitespace) {
            return Err(ConfigError {
                name: "BRAIN_OPERATOR_TOKEN",
                problem: format!("must have at least {MIN_CHARS} characters and no whitespace"),
            });
        }
        Ok(Some(Self(Sha256::digest(raw.as_bytes()).into())))
    }

    /// Whether `bearer` is the operator's token.
    pub fn matches(&self, bearer: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(bearer.as_bytes()).into();
        super::constant_time_eq(&given, &self.0)
    }
}

#[cfg(test)]
mod tests {
    use envcfg::vars;

    use super::*;

    #[test]
    fn a_short_token_is_refused_and_a_good_one_matches_only_itself() {
        let short = vars(&[("BRAIN_OPERATOR_TOKEN", "too-short")]);
        assert!(OperatorToken::from_env(&short).is_err());
        assert!(OperatorToken::from_env(&vars(&[])).unwrap().is_none());
        let good = "op-0123456789abcdef0123456789abcdef";
        let token = OperatorToken::from_env(&vars(&[("BRAIN_OPERATOR_TOKEN", good)]))
            .unwrap()
            .unwrap();
        assert!(token.matches(good));
        assert!(!token.matches("op-0123456789abcdef0123456789abcdeF"));
        assert!(!format!("{token:?}").contains("0123"));
    }
}
