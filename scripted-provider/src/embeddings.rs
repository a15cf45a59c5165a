//! `POST /v1/embeddings` on the OpenAI wire (B6), deterministic.
//!
//! Why this shape: a real embedding model's point is that texts of like meaning are near
//! even when they share no word. A test of hybrid search needs exactly that, and no model
//! can run here, so each text becomes a hashed bag of *concepts*: its words, each mapped
//! to its group's first word when it is in one of the small synonym groups of
//! [`SYNONYMS`] (so "holiday" and "vacation" are one dimension), hashed with a sign into
//! [`DIMENSIONS`] dimensions and normalised. Texts sharing words or synonyms are near
//! (cosine > 0); texts sharing neither are at cosine 0 but for hash collisions. The same
//! text always gives the same vector, so a test can reason about which passage is nearest.

use axum::Json;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The width of every vector served.
pub const DIMENSIONS: usize = 256;

/// Groups of words taken as one meaning; the first word names the group.
const SYNONYMS: &[&[&str]] = &[
    &[
        "vacation",
        "vacations",
        "holiday",
        "holidays",
        "leave",
        "time-off",
    ],
    &[
        "car",
        "cars",
        "automobile",
        "automobiles",
        "vehicle",
        "vehicles",
    ],
    &["salary", "salaries", "pay", "wage", "wages", "compensation"],
    &["doctor", "doctors", "physician", "physicians", "medic"],
    &[
        "laptop",
        "laptops",
        "computer",
        "computers",
        "notebook",
        "notebooks",
    ],
    &["begin", "start", "commence", "onboarding"],
];

/// Words that carry no meaning of their own.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "how", "what", "which", "who", "with", "our", "your", "you",
    "many", "much", "does", "can", "get", "each", "per", "any", "from", "that", "this",
];

/// The vector of `text`: see the module's comment.
pub fn embed(text: &str) -> Vec<f32> {
    let mut vector = vec![0f32; DIMENSIONS];
    for word in words(text) {
        let concept = SYNONYMS
            .iter()
            .find(|group| group.contains(&word.as_str()))
            .map_or(word.as_str(), |group| group[0]);
        let hash = fnv1a(concept.as_bytes());
        let sign = if hash >> 63 == 1 { -1.0 } else { 1.0 };
        vector[(hash % DIMENSIONS as u64) as usize] += sign;
    }
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
    vector
}

/// The lowercase words of `text` of three letters or more, but for stopwords.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Answers an embeddings request as OpenAI does: one vector per input, with the usage.
pub(crate) async fn handler(raw: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let inputs: Option<Vec<String>> = match body.get("input") {
        Some(Value::String(one)) => Some(vec![one.clone()]),
        Some(Value::Array(many)) => many.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => None,
    };
    let (Some(inputs), Some(model)) = (inputs, body.get("model").and_then(Value::as_str)) else {
        let error = json!({"error": {"message": "'input' and 'model' are required.",
            "type": "invalid_request_error", "param": null, "code": null}});
        return (StatusCode::BAD_REQUEST, Json(error)).into_response();
    };
    let tokens: usize = inputs.iter().map(|text| words(text).count()).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| json!({"object": "embedding", "index": index, "embedding": embed(text)}))
        .collect();
    Json(json!({"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &str, b: &str) -> f32 {
        embed(a).iter().zip(embed(b)).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn synonyms_are_near_and_unrelated_texts_are_not() {
        let passage = "Staff get twenty-five days of paid vacation every year.";
        assert!(cosine("annual holiday allowance", passage) > 0.2);
        assert!(
            cosine(
                "annual holiday allowance",
                "Printers are on the second floor."
            ) < 0.1
        );
        assert_eq!(embed(passage), embed(passage));
        let norm: f32 = embed(passage).iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}
