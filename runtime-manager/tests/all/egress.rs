//! A session's egress proxy configuration from Postgres (W13, W14): the agent's allowlist
//! and its egress secrets unsealed, a warm-pool slot's once claimed, and a launch that
//! must not run without the key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use domain::egress::SecretEgress;
use protocol::SessionId;
use runtime_manager::egress::{EgressDefaults, EgressError, policy_for};
use store::{Actor, SecretsKey};

use crate::common::Harness;

const KEY_HEX: &str = "5e1f2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";

const PRIVATE: EgressDefaults = EgressDefaults {
    allow_private_networks: true,
    open: true,
};

fn shared(h: &Harness, key: Option<SecretsKey>) -> store::Store {
    store::Store::from_pool(h.pool.clone()).with_secrets_key(key)
}

#[tokio::test]
async fn a_sessions_policy_holds_its_agents_allowlist_and_unsealed_egress_secrets() {
    let h = Harness::new().await;
    let (session, _) = h.insert_session("provisioning", "light").await;
    let key = SecretsKey::parse(KEY_HEX).unwrap();
    let keyed = shared(&h, Some(key));

    // No allowlist, no secrets: every host, as before W14; where the default is closed
    // (the chart's), no host.
    let open = policy_for(&keyed, session, EgressDefaults::default())
        .await
        .unwrap();
    assert_eq!((open.allow, open.secrets.len()), (None, 0));
    let closed = EgressDefaults {
        open: false,
        ..EgressDefaults::default()
    };
    let shut = policy_for(&keyed, session, closed).await.unwrap();
    assert_eq!((shut.allow, shut.secrets.len()), (Some(Vec::new()), 0));

    sqlx::query("UPDATE agents SET egress = $1 WHERE id = $2")
        .bind(serde_json::json!({"allow": ["docs.rs", "*.pypi.org"]}))
        .bind(h.agent.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let egress = SecretEgress {
        hosts: vec!["api.github.com".into()],
        header: "Authorization".into(),
        format: "Bearer {value}".into(),
    };
    let by = Actor::operator(None);
    keyed
        .put_agent_secret(
            h.team,
            h.agent,
            "GH_TOKEN",
            "ghp_v1",
            Some(&egress),
            100,
            &by,
        )
        .await
        .unwrap();
    keyed
        .put_agent_secret(h.team, h.agent, "PLAIN", "plain-1", None, 100, &by)
        .await
        .unwrap();
    let policy = policy_for(&keyed, session, PRIVATE).await.unwrap();
    assert_eq!(
        policy.allow.as_deref(),
        Some(&["docs.rs".to_owned(), "*.pypi.org".to_owned()][..])
    );
    assert!(policy.allow_private_networks);
    let [secret] = &policy.secrets[..] else {
        panic!("one egress secret, the ordinary one left to the environment: {policy:?}");
    };
    assert_eq!(
        (
            secret.name.as_str(),
            secret.value.as_str(),
            &secret.hosts[..]
        ),
        ("GH_TOKEN", "ghp_v1", &["api.github.com".to_owned()][..])
    );
    assert_eq!(
        (secret.header.as_str(), secret.format.as_str()),
        ("Authorization", "Bearer {value}")
    );
    // A value replaced during the session is what the next read gives.
    keyed
        .put_agent_secret(
            h.team,
            h.agent,
            "GH_TOKEN",
            "ghp_v2",
            Some(&egress),
            100,
            &by,
        )
        .await
        .unwrap();
    let policy = policy_for(&keyed, session, EgressDefaults::default())
        .await
        .unwrap();
    assert_eq!(policy.secrets[0].value, "ghp_v2");

    // Without the key the launch must fail with a class of its own.
    let err = policy_for(&shared(&h, None), session, EgressDefaults::default())
        .await
        .unwrap_err();
    assert!(matches!(err, EgressError::SecretsKeyMissing), "{err:?}");
    assert_eq!(err.metric_label(), "egress_secrets_key_missing");
}

#[tokio::test]
async fn a_warm_pool_slot_reaches_nothing_until_claimed_then_its_sessions_policy() {
    let h = Harness::new().await;
    let store = shared(&h, None);
    let slot = SessionId::new();
    sqlx::query("INSERT INTO worker_pool (id, profile, state) VALUES ($1, 'light', 'idle')")
        .bind(slot.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let waiting = policy_for(&store, slot, EgressDefaults::default())
        .await
        .unwrap();
    assert_eq!(waiting.allow, Some(Vec::new()));

    sqlx::query("UPDATE agents SET egress = $1 WHERE id = $2")
        .bind(serde_json::json!({"allow": ["docs.rs"]}))
        .bind(h.agent.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let (session, _) = h.insert_session("ready", "light").await;
    sqlx::query("UPDATE worker_pool SET state = 'claimed', session_id = $2 WHERE id = $1")
        .bind(slot.0)
        .bind(session.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let claimed = policy_for(&store, slot, EgressDefaults::default())
        .await
        .unwrap();
    assert_eq!(claimed.allow, Some(vec!["docs.rs".to_owned()]));
}
