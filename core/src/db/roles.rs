//! Which database role a connection acts as, and what it could do to the schema (issue 31). The
//! migrations' role owns the tables; `serve` should connect as a member of [`APP_ROLE`], which
//! owns nothing, so the immutability triggers bind it (an owner may disable them) and it holds no
//! UPDATE or DELETE on the money tables (`migrations/20261215100000_application_role.sql`).

use sqlx::PgExecutor;

/// The role the migrations grant the serving process's privileges to; a login role is made a
/// member of it.
pub const APP_ROLE: &str = "tokenfactory_app";

/// What the connected role may do beyond the application's privileges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The role the connection acts as (`current_user`).
    pub user: String,
    pub superuser: bool,
    /// CREATEROLE can grant itself into other roles (before PostgreSQL 16, into any).
    pub createrole: bool,
    /// A table, view or sequence of the schema it owns (directly or through a role it is a
    /// member of), `public` itself when it owns the schema (the database's owner does).
    pub owns: Option<String>,
}

impl Standing {
    /// Why this role may rewrite history (disable a trigger, drop a table), `None` when it may
    /// not.
    pub fn too_powerful(&self) -> Option<String> {
        if self.superuser {
            Some(format!("{} is a superuser", self.user))
        } else if let Some(what) = &self.owns {
            Some(format!("{} owns {what}", self.user))
        } else if self.createrole {
            Some(format!(
                "{} has CREATEROLE (it can grant itself other roles)",
                self.user
            ))
        } else {
            None
        }
    }
}

/// The connected role's standing.
pub async fn standing(db: impl PgExecutor<'_>) -> sqlx::Result<Standing> {
    let row = sqlx::query!(
        r#"SELECT current_user::text AS "user!", r.rolsuper AS "superuser!",
                  r.rolcreaterole AS "createrole!",
                  COALESCE(
                      (SELECT 'schema ' || n.nspname FROM pg_namespace n
                        WHERE n.nspname = 'public' AND pg_has_role(n.nspowner, 'MEMBER')),
                      (SELECT 'table ' || c.relname FROM pg_class c
                         JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
                          AND pg_has_role(c.relowner, 'MEMBER')
                        ORDER BY c.relname LIMIT 1)) AS owns
           FROM pg_roles r WHERE r.rolname = current_user"#
    )
    .fetch_one(db)
    .await?;
    Ok(Standing {
        user: row.user,
        superuser: row.superuser,
        createrole: row.createrole,
        owns: row.owns,
    })
}

/// Makes `login_role` a member of [`APP_ROLE`] (nothing if it is already). Run by the owner
/// after migrating (`tokenfactory migrate --grant-app-role`), so the serving login needs no
/// hand-written GRANT.
pub async fn grant_app_role(db: impl PgExecutor<'_>, login_role: &str) -> sqlx::Result<()> {
    // A role name cannot be a bind parameter: quoted here as an identifier instead.
    let quoted = format!("\"{}\"", login_role.replace('"', "\"\""));
    sqlx::query(&format!("GRANT {APP_ROLE} TO {quoted}"))
        .execute(db)
        .await?;
    Ok(())
}
