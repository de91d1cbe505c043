//! Tenant roles and `/members`, driven like a browser with JavaScript off: a read-only user reads
//! but every form it posts is refused and changes nothing; a member manages keys but not people;
//! an owner invites (the one-time link works once, is stored hashed, expires), changes roles and
//! removes (the removed user's sessions end), but never leaves the tenant without an owner;
//! another tenant's users cannot be touched; owner actions are in the audit log.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::portal::{
    assert_redirect, location, sessions_of, Browser, TestPortal, MEMBER, PASSWORD,
};
use common::TestApp;
use reqwest::StatusCode;
use sqlx::PgPool;

/// Posts a form with the CSRF token of `page`; returns where it redirected to.
async fn submit(b: &Browser, page: &str, action: &str, fields: &[(&str, &str)]) -> String {
    let token = b.token_on(page).await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    let res = b.post(action, &form).await;
    assert!(res.status().is_redirection(), "{action}: {}", res.status());
    location(&res).unwrap().to_owned()
}

async fn signed_in(p: &TestPortal, email: &str, password: &str) -> Browser {
    let b = p.browser();
    assert_redirect(&b.login(email, password).await, "/");
    b
}

/// The invitation link shown once on `/members` after an invite.
fn shown_link(html: &str) -> Option<String> {
    let marker = r#"id="invite-link""#;
    let at = html.find(marker)?;
    let start = at + html[at..].find('>')? + 1;
    let len = html[start..].find('<')?;
    Some(html[start..start + len].to_owned())
}

/// The owner invites `email` as `role`; the invitee joins through the link. Returns the
/// invitee's signed-in browser and the link's path.
async fn invite_and_join(
    p: &TestPortal,
    owner: &Browser,
    email: &str,
    role: &str,
) -> (Browser, String) {
    let back = submit(
        owner,
        "/members",
        "/api/invite_member",
        &[("email", email), ("role", role)],
    )
    .await;
    assert_eq!(back, "/members");
    let html = owner.html("/members").await;
    let link = shown_link(&html).expect("the link is shown after inviting");
    assert!(
        shown_link(&owner.html("/members").await).is_none(),
        "shown once"
    );
    let path = link
        .split_once("/invite/")
        .map(|(_, t)| format!("/invite/{t}"))
        .unwrap();
    let invitee = p.browser();
    let page = invitee.html(&path).await;
    assert!(page.contains(email), "{page}");
    let token = path.trim_start_matches("/invite/");
    let back = submit(
        &invitee,
        &path,
        "/api/accept_invitation",
        &[
            ("token", token),
            ("password", PASSWORD),
            ("confirm", PASSWORD),
        ],
    )
    .await;
    assert_eq!(back, "/");
    assert!(invitee.html("/").await.contains(email));
    (invitee, path)
}

async fn keys_of_tenant(pool: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM api_keys"#)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn role_of(pool: &PgPool, email: &str) -> String {
    sqlx::query_scalar!("SELECT tenant_role FROM users WHERE email = $1", email)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn user_id(pool: &PgPool, email: &str) -> String {
    sqlx::query_scalar!("SELECT id FROM users WHERE email = $1", email)
        .fetch_one(pool)
        .await
        .unwrap()
        .to_string()
}

#[sqlx::test(migrations = "../migrations")]
async fn existing_and_cli_tenant_users_are_owners(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    assert_eq!(role_of(&p.pool, MEMBER).await, "owner");
    common::portal::admin(
        &p.pool,
        &[
            "create-tenant",
            "--name",
            "globex",
            "--member-email",
            "hank@globex.test",
            "--member-password",
            PASSWORD,
        ],
    )
    .await;
    assert_eq!(role_of(&p.pool, "hank@globex.test").await, "owner");
}

#[sqlx::test(migrations = "../migrations")]
async fn read_only_changes_nothing(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    let (ro, _) = invite_and_join(&p, &owner, "rita@acme.test", "read_only").await;
    assert_eq!(role_of(&p.pool, "rita@acme.test").await, "read_only");

    // Reads every tenant page.
    for page in ["/", "/keys", "/usage", "/logs", "/members", "/models"] {
        ro.html(page).await;
    }
    let keys_page = ro.html("/keys").await;
    assert!(keys_page.contains("read-only"), "{keys_page}");
    assert!(
        !keys_page.contains("/api/create_key"),
        "no create form for read-only"
    );

    // A browser post is sent back with a message; nothing is created.
    let back = submit(&ro, "/keys", "/api/create_key", &[("name", "sneaky")]).await;
    assert_eq!(back, "/keys");
    assert!(ro
        .html("/keys")
        .await
        .contains("Your role does not allow that"));
    assert_eq!(keys_of_tenant(&p.pool).await, 0);
    // Another client (the server-function client) gets 403.
    let token = ro.token_on("/keys").await;
    let res = ro
        .post_accepting(
            "/api/create_key",
            &[("csrf", &token), ("name", "x")],
            "application/json",
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(keys_of_tenant(&p.pool).await, 0);

    // A key the owner made cannot be revoked or rotated by read-only.
    let back = submit(&owner, "/keys", "/api/create_key", &[("name", "prod")]).await;
    assert_eq!(back, "/keys");
    let key: String = sqlx::query_scalar!("SELECT id::text AS \"id!\" FROM api_keys")
        .fetch_one(&p.pool)
        .await
        .unwrap();
    submit(&ro, "/keys", "/api/revoke_key", &[("key", &key)]).await;
    submit(
        &ro,
        "/keys",
        "/api/rotate_key",
        &[("key", &key), ("grace", "0")],
    )
    .await;
    let live: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM api_keys WHERE revoked_at IS NULL AND expires_at IS NULL"#
    )
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!((keys_of_tenant(&p.pool).await, live), (1, 1));

    // Nor people: no invitation, no role change.
    let invitations_before: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM invitations"#)
            .fetch_one(&p.pool)
            .await
            .unwrap();
    submit(
        &ro,
        "/members",
        "/api/invite_member",
        &[("email", "x@acme.test"), ("role", "owner")],
    )
    .await;
    let rita = user_id(&p.pool, "rita@acme.test").await;
    submit(
        &ro,
        "/members",
        "/api/change_role",
        &[("user", &rita), ("role", "owner")],
    )
    .await;
    let invitations_after: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM invitations"#)
        .fetch_one(&p.pool)
        .await
        .unwrap();
    assert_eq!(invitations_before, invitations_after);
    assert_eq!(role_of(&p.pool, "rita@acme.test").await, "read_only");
    assert!(!ro.html("/members").await.contains("/api/invite_member"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_member_manages_keys_but_not_people(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    let (m, _) = invite_and_join(&p, &owner, "max@acme.test", "member").await;
    assert_eq!(
        submit(&m, "/keys", "/api/create_key", &[("name", "ci")]).await,
        "/keys"
    );
    assert_eq!(keys_of_tenant(&p.pool).await, 1);
    let ada = user_id(&p.pool, MEMBER).await;
    submit(&m, "/members", "/api/remove_member", &[("user", &ada)]).await;
    submit(
        &m,
        "/members",
        "/api/change_role",
        &[("user", &ada), ("role", "read_only")],
    )
    .await;
    assert_eq!(role_of(&p.pool, MEMBER).await, "owner");
    assert!(m
        .html("/members")
        .await
        .contains("Your role does not allow that"));
}

#[sqlx::test(migrations = "../migrations")]
async fn the_last_owner_stays(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    let ada = user_id(&p.pool, MEMBER).await;
    submit(
        &owner,
        "/members",
        "/api/change_role",
        &[("user", &ada), ("role", "member")],
    )
    .await;
    assert!(owner.html("/members").await.contains("at least one owner"));
    submit(&owner, "/members", "/api/remove_member", &[("user", &ada)]).await;
    assert_eq!(role_of(&p.pool, MEMBER).await, "owner");

    // With a second owner, the first may step down; then the second is the last.
    let (bo, _) = invite_and_join(&p, &owner, "bo@acme.test", "owner").await;
    submit(
        &owner,
        "/members",
        "/api/change_role",
        &[("user", &ada), ("role", "member")],
    )
    .await;
    assert_eq!(role_of(&p.pool, MEMBER).await, "member");
    let bo_id = user_id(&p.pool, "bo@acme.test").await;
    submit(&bo, "/members", "/api/remove_member", &[("user", &bo_id)]).await;
    assert_eq!(role_of(&p.pool, "bo@acme.test").await, "owner");

    let audit: Vec<String> = sqlx::query_scalar!(
        r#"SELECT action || ' ' || target || ' ' || actor AS "a!" FROM audit_log ORDER BY id"#
    )
    .fetch_all(&p.pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        [
            "member.invite bo@acme.test ada@acme.test",
            "member.join bo@acme.test bo@acme.test",
            "member.role ada@acme.test ada@acme.test",
        ]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn an_invitation_works_once_is_stored_hashed_and_expires(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    let (_, path) = invite_and_join(&p, &owner, "ivy@acme.test", "member").await;
    let token = path.trim_start_matches("/invite/").to_owned();
    let stored: Vec<String> =
        sqlx::query_scalar!(r#"SELECT encode(token_sha256, 'hex') AS "t!" FROM invitations"#)
            .fetch_all(&p.pool)
            .await
            .unwrap();
    assert!(stored.iter().all(|t| *t != token));

    // Used: the page says so, and a second accept makes no account.
    let other = p.browser();
    assert!(other.html(&path).await.contains("not valid"));
    let csrf = other.token_on("/login").await;
    other
        .post(
            "/api/accept_invitation",
            &[
                ("csrf", &csrf),
                ("token", &token),
                ("password", PASSWORD),
                ("confirm", PASSWORD),
            ],
        )
        .await;
    let users: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM users"#)
        .fetch_one(&p.pool)
        .await
        .unwrap();
    assert_eq!(users, 3, "ada, the admin, ivy");

    // Expired: refused.
    owner
        .post(
            "/api/invite_member",
            &[
                ("csrf", &owner.token_on("/members").await),
                ("email", "late@acme.test"),
                ("role", "member"),
            ],
        )
        .await;
    let link = shown_link(&owner.html("/members").await).unwrap();
    let late = link.split_once("/invite/").unwrap().1.to_owned();
    sqlx::query!("UPDATE invitations SET expires_at = now() - interval '1 second' WHERE email = 'late@acme.test'")
        .execute(&p.pool)
        .await
        .unwrap();
    let b = p.browser();
    assert!(b
        .html(&format!("/invite/{late}"))
        .await
        .contains("not valid"));
    // The page offers no form; a post made anyway (with the login page's token) is refused.
    let back = submit(
        &b,
        "/login",
        "/api/accept_invitation",
        &[
            ("token", &late),
            ("password", PASSWORD),
            ("confirm", PASSWORD),
        ],
    )
    .await;
    assert_eq!(back, format!("/invite/{late}"));
    let joined: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM users WHERE email = 'late@acme.test'"#)
            .fetch_one(&p.pool)
            .await
            .unwrap();
    assert_eq!(joined, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn removing_a_member_ends_their_sessions(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    let (gone, _) = invite_and_join(&p, &owner, "gus@acme.test", "member").await;
    assert_eq!(sessions_of(&p.pool, "gus@acme.test").await, 1);
    let gus = user_id(&p.pool, "gus@acme.test").await;
    submit(&owner, "/members", "/api/remove_member", &[("user", &gus)]).await;
    assert_eq!(sessions_of(&p.pool, "gus@acme.test").await, 0);
    assert_redirect(&gone.get("/keys").await, "/login");
    assert!(owner.html("/members").await.contains("Member removed"));
}

#[sqlx::test(migrations = "../migrations")]
async fn another_tenants_users_cannot_be_touched(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    common::portal::admin(
        &p.pool,
        &[
            "create-tenant",
            "--name",
            "globex",
            "--member-email",
            "hank@globex.test",
            "--member-password",
            PASSWORD,
        ],
    )
    .await;
    let hank = user_id(&p.pool, "hank@globex.test").await;
    let owner = signed_in(&p, MEMBER, PASSWORD).await;
    submit(
        &owner,
        "/members",
        "/api/change_role",
        &[("user", &hank), ("role", "read_only")],
    )
    .await;
    submit(&owner, "/members", "/api/remove_member", &[("user", &hank)]).await;
    assert_eq!(role_of(&p.pool, "hank@globex.test").await, "owner");
    let html = owner.html("/members").await;
    assert!(html.contains("No such member"));
    assert!(!html.contains("hank@globex.test"));
}
