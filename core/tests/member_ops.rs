//! A member's key actions and password change are audited in the action's own transaction
//! (issue 31): who created, rotated or revoked which key, and whose password changed; an action
//! that does nothing writes no row, and an audit row that cannot be written undoes the action.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::PgPool;
use tf_core::db::audit;
use tf_core::keys::IssueError;
use tf_core::member_ops;
use tf_core::operator::Actor;
use uuid::Uuid;

async fn tenant(pool: &PgPool, name: &str) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, name, name)
        .await
        .unwrap()
        .id
}

fn member(id: Uuid) -> Actor<'static> {
    Actor {
        user_id: Some(id),
        name: "owner@acme.test",
        source_ip: Some("192.0.2.7"),
    }
}

async fn rows(pool: &PgPool, tenant: Uuid) -> Vec<audit::Row> {
    let mut rows = audit::page(pool, Some(tenant), None, 100).await.unwrap();
    rows.reverse();
    rows
}

async fn working_keys(pool: &PgPool, tenant: Uuid) -> i64 {
    tf_core::db::keys::count_active(pool, tenant).await.unwrap()
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn key_create_rotate_revoke_each_leave_one_row(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let other = tenant(&pool, "globex").await;
    let who = member(Uuid::now_v7());

    let (key, secret) = member_ops::create_key(&pool, &who, t, "ci", 10)
        .await
        .unwrap();
    assert!(secret.starts_with(&key.prefix));
    let rotated = member_ops::rotate_key(&pool, &who, t, key.id, 3600)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.old_prefix, key.prefix);
    let revoked = member_ops::revoke_key(&pool, &who, t, rotated.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.prefix, rotated.prefix);

    let got = rows(&pool, t).await;
    let summary: Vec<_> = got
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str(), r.actor.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("key.create", key.prefix.as_str(), "owner@acme.test"),
            ("key.rotate", key.prefix.as_str(), "owner@acme.test"),
            ("key.revoke", rotated.prefix.as_str(), "owner@acme.test"),
        ]
    );
    assert!(got
        .iter()
        .all(|r| r.source_ip.as_deref() == Some("192.0.2.7")));
    assert_eq!(got[0].detail["name"], "ci");
    assert_eq!(got[1].detail["new_prefix"], rotated.prefix.as_str());
    assert_eq!(got[1].detail["grace_secs"], 3600);
    assert!(!got.iter().any(|r| r.detail.to_string().contains(&secret)
        || r.detail.to_string().contains(&rotated.secret)));

    // Nothing done, nothing recorded: another tenant's key, a revoked key, the cap reached.
    let (theirs, _) = member_ops::create_key(&pool, &who, other, "x", 10)
        .await
        .unwrap();
    assert!(member_ops::revoke_key(&pool, &who, t, theirs.id)
        .await
        .unwrap()
        .is_none());
    assert!(member_ops::rotate_key(&pool, &who, t, rotated.id, 0)
        .await
        .unwrap()
        .is_none());
    // The rotated key works through its grace: one working key, so a cap of 2 takes one more.
    member_ops::create_key(&pool, &who, t, "more", 2)
        .await
        .unwrap();
    let over = member_ops::create_key(&pool, &who, t, "one too many", 2).await;
    assert!(
        matches!(over, Err(IssueError::TooMany { cap: 2 })),
        "{over:?}"
    );
    assert_eq!(rows(&pool, t).await.len(), 4, "only the one more create");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_audit_row_that_cannot_be_written_undoes_the_action(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    // audit_log refuses an empty actor (CHECK): the action must roll back with it.
    let nobody = Actor {
        user_id: None,
        name: "",
        source_ip: None,
    };
    assert!(member_ops::create_key(&pool, &nobody, t, "ci", 10)
        .await
        .is_err());
    assert_eq!(working_keys(&pool, t).await, 0);

    let (key, _) = member_ops::create_key(&pool, &member(Uuid::now_v7()), t, "ci", 10)
        .await
        .unwrap();
    assert!(member_ops::revoke_key(&pool, &nobody, t, key.id)
        .await
        .is_err());
    assert!(member_ops::rotate_key(&pool, &nobody, t, key.id, 0)
        .await
        .is_err());
    assert_eq!(
        working_keys(&pool, t).await,
        1,
        "still working, not rotated"
    );
    assert_eq!(rows(&pool, t).await.len(), 1);
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_password_change_is_audited_and_ends_sessions(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let user = tf_core::accounts::create_user(
        &pool,
        "owner@acme.test",
        "correct horse battery",
        tf_core::Role::TenantMember,
        Some(t),
    )
    .await
    .unwrap();
    let before = tf_core::db::members::password_hash(&pool, user.id)
        .await
        .unwrap()
        .unwrap();
    let hash = tf_core::accounts::hash_password("a new long password")
        .await
        .unwrap();

    // A failed audit write keeps the old password.
    let nobody = Actor {
        user_id: None,
        name: "",
        source_ip: None,
    };
    assert!(
        member_ops::change_password(&pool, &nobody, user.id, Some(t), &user.email, &hash)
            .await
            .is_err()
    );
    assert_eq!(
        tf_core::db::members::password_hash(&pool, user.id)
            .await
            .unwrap()
            .unwrap(),
        before
    );

    member_ops::change_password(
        &pool,
        &member(user.id),
        user.id,
        Some(t),
        &user.email,
        &hash,
    )
    .await
    .unwrap();
    assert!(
        tf_core::accounts::verify_password(
            "a new long password",
            &tf_core::db::members::password_hash(&pool, user.id)
                .await
                .unwrap()
                .unwrap()
        )
        .await
    );
    let got = rows(&pool, t).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].action, "user.change_password");
    assert_eq!(got[0].target, "owner@acme.test");
    assert!(
        !got[0].detail.to_string().contains("argon2"),
        "no hash in the log"
    );
}
