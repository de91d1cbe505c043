//! `/settings`, driven like a browser with JavaScript off: an owner changes the tenant's name,
//! opts in to request-body logging and sets the retention (each audit-logged); members and
//! read-only users cannot; a password change needs the current password and ends the user's other
//! sessions while this one continues.

#![expect(
    clippy::unwrap_used,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::portal::{
    assert_redirect, location, sessions_of, Browser, TestPortal, MEMBER, PASSWORD,
};
use common::TestApp;
use sqlx::PgPool;

async fn submit(b: &Browser, action: &str, fields: &[(&str, &str)]) -> String {
    let token = b.token_on("/settings").await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    let res = b.post(action, &form).await;
    assert!(res.status().is_redirection(), "{action}: {}", res.status());
    location(&res).unwrap().to_owned()
}

async fn signed_in(p: &TestPortal, email: &str) -> Browser {
    let b = p.browser();
    assert_redirect(&b.login(email, PASSWORD).await, "/");
    b
}

struct Settings {
    display_name: String,
    body_logging: bool,
    body_retention_days: i32,
}

async fn settings(pool: &PgPool) -> Settings {
    sqlx::query_as!(
        Settings,
        "SELECT display_name, body_logging, body_retention_days FROM tenants WHERE name = 'acme'"
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn audit(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar!(r#"SELECT action || ' ' || actor AS "a!" FROM audit_log ORDER BY id"#)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn an_owner_opts_in_and_it_is_audited(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER).await;
    let before = settings(&p.pool).await;
    assert!(!before.body_logging, "off by default");
    assert!(owner
        .html("/settings")
        .await
        .contains("Store request bodies"));

    let fields = [
        ("display_name", "Acme Labs"),
        ("body_logging", "on"),
        ("retention_days", "7"),
    ];
    assert_eq!(
        submit(&owner, "/api/save_tenant_settings", &fields).await,
        "/settings"
    );
    let after = settings(&p.pool).await;
    assert_eq!(
        (
            after.display_name.as_str(),
            after.body_logging,
            after.body_retention_days
        ),
        ("Acme Labs", true, 7)
    );
    let html = owner.html("/settings").await;
    assert!(
        html.contains(r#"class="flash ok""#),
        "success style: {html}"
    );
    assert_eq!(
        audit(&p.pool).await,
        [
            "tenant.rename ada@acme.test",
            "bodies.opt_in ada@acme.test",
            "bodies.retention ada@acme.test"
        ]
    );

    // Out of bounds: nothing changes. Unticked: opted out.
    let bad = [("display_name", "Acme Labs"), ("retention_days", "0")];
    submit(&owner, "/api/save_tenant_settings", &bad).await;
    assert!(settings(&p.pool).await.body_logging);
    let off = [("display_name", "Acme Labs"), ("retention_days", "7")];
    submit(&owner, "/api/save_tenant_settings", &off).await;
    assert!(!settings(&p.pool).await.body_logging);
    assert_eq!(
        audit(&p.pool).await.last().unwrap(),
        "bodies.opt_out ada@acme.test"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn only_owners_change_tenant_settings(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    for role in ["member", "read_only"] {
        let email = format!("{role}@acme.test");
        sqlx::query!(
            "INSERT INTO users (id, email, password_hash, role, tenant_id, tenant_role)
             SELECT gen_random_uuid(), $1, password_hash, 'tenant_member', tenant_id, $2
             FROM users WHERE email = $3",
            email,
            role,
            MEMBER,
        )
        .execute(&p.pool)
        .await
        .unwrap();
        let b = signed_in(&p, &email).await;
        let html = b.html("/settings").await;
        assert!(!html.contains("save_tenant_settings"), "no form for {role}");
        let fields = [
            ("display_name", "Pwned"),
            ("body_logging", "on"),
            ("retention_days", "365"),
        ];
        submit(&b, "/api/save_tenant_settings", &fields).await;
        let s = settings(&p.pool).await;
        assert_eq!(
            (s.display_name.as_str(), s.body_logging),
            ("Acme Corp", false),
            "{role}"
        );
        assert!(b
            .html("/settings")
            .await
            .contains("Your role does not allow that"));
        // Their own name they may set.
        submit(&b, "/api/save_profile", &[("display_name", "Max")]).await;
        let name: String =
            sqlx::query_scalar!("SELECT display_name FROM users WHERE email = $1", email)
                .fetch_one(&p.pool)
                .await
                .unwrap();
        assert_eq!(name, "Max");
    }
    assert!(audit(&p.pool).await.is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn a_password_change_needs_the_current_one_and_ends_other_sessions(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let here = signed_in(&p, MEMBER).await;
    let elsewhere = signed_in(&p, MEMBER).await;
    assert_eq!(sessions_of(&p.pool, MEMBER).await, 2);
    let new = "a much longer passphrase";

    let wrong = [
        ("current", "not it at all"),
        ("password", new),
        ("confirm", new),
    ];
    submit(&here, "/api/change_password", &wrong).await;
    assert!(here
        .html("/settings")
        .await
        .contains("current password is wrong"));
    assert_eq!(sessions_of(&p.pool, MEMBER).await, 2);

    let right = [("current", PASSWORD), ("password", new), ("confirm", new)];
    assert_eq!(
        submit(&here, "/api/change_password", &right).await,
        "/settings"
    );
    assert!(here.html("/settings").await.contains("Password changed"));
    assert_redirect(&elsewhere.get("/settings").await, "/login");
    assert_eq!(sessions_of(&p.pool, MEMBER).await, 1);
    assert_redirect(&p.browser().login(MEMBER, PASSWORD).await, "/login");
    assert_redirect(&p.browser().login(MEMBER, new).await, "/");
    // One audit row, for the successful change only, naming the member and never the hash.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, target, detail::text FROM audit_log WHERE action = 'user.change_password'",
    )
    .fetch_all(&p.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].0.as_str(), rows[0].1.as_str()), (MEMBER, MEMBER));
    assert!(!rows[0].2.contains("argon2"), "{}", rows[0].2);
}
