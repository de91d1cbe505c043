//! The invoice as a document: its number, issuer ("From"), bill-to and due date, which the
//! database fixes on the invoice when it is issued (trigger `invoices_document`, migration
//! `invoice_document`), and the editable sources they are copied from: the one issuer row and
//! each tenant's billing address. A draft shows the sources as they are now.

use sqlx::{PgConnection, PgExecutor};
use time::OffsetDateTime;
use uuid::Uuid;

/// The document fields of one invoice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// `INV-2026-000001` or `CN-2026-000001`; `None` for a draft (numbered when issued).
    pub number: Option<String>,
    /// Lines of "From": the issuer's name and address.
    pub issuer: String,
    /// Lines of "Bill to": the tenant's name, handle and billing address.
    pub bill_to: String,
    /// `None` for a draft.
    pub due_at: Option<OffsetDateTime>,
    /// The payment terms (days from issue to due): the invoice's own once issued, else those a
    /// draft would be issued with now.
    pub due_days: i32,
}

/// The document fields of `tenant`'s invoice `id` (`tenant: None`: any tenant's, for admins).
pub async fn of_invoice(
    db: impl PgExecutor<'_>,
    tenant: Option<Uuid>,
    id: Uuid,
) -> sqlx::Result<Option<Document>> {
    sqlx::query_as!(
        Document,
        r#"SELECT i.number, COALESCE(i.issuer, invoice_issuer_text(), '') AS "issuer!",
                  COALESCE(i.bill_to, invoice_bill_to(i.tenant_id), '') AS "bill_to!",
                  i.due_at,
                  COALESCE(extract(day FROM i.due_at - i.issued_at)::int,
                           (SELECT due_days FROM invoice_issuer)) AS "due_days!"
           FROM invoices i WHERE i.id = $2 AND ($1::uuid IS NULL OR i.tenant_id = $1)"#,
        tenant,
        id,
    )
    .fetch_optional(db)
    .await
}

/// The document fields a draft of `tenant` would be issued with now (the live draft of the
/// open month has no stored row to read them from).
pub async fn of_draft(db: impl PgExecutor<'_>, tenant: Uuid) -> sqlx::Result<Document> {
    sqlx::query_as!(
        Document,
        r#"SELECT NULL::text AS "number?", COALESCE(invoice_issuer_text(), '') AS "issuer!",
                  COALESCE(invoice_bill_to($1), '') AS "bill_to!", NULL::timestamptz AS "due_at?",
                  (SELECT due_days FROM invoice_issuer) AS "due_days!""#,
        tenant,
    )
    .fetch_one(db)
    .await
}

/// Who issues invoices.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Issuer {
    pub name: String,
    pub address: String,
    pub due_days: i32,
}

pub async fn issuer(db: impl PgExecutor<'_>) -> sqlx::Result<Issuer> {
    sqlx::query_as!(Issuer, "SELECT name, address, due_days FROM invoice_issuer")
        .fetch_one(db)
        .await
}

/// Replaces the issuer's details; returns what they were (locked until the transaction ends).
pub async fn set_issuer(conn: &mut PgConnection, new: &Issuer) -> sqlx::Result<Issuer> {
    let was = sqlx::query_as!(
        Issuer,
        "SELECT name, address, due_days FROM invoice_issuer FOR UPDATE"
    )
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query!(
        "UPDATE invoice_issuer SET name = $1, address = $2, due_days = $3, updated_at = now()",
        new.name,
        new.address,
        new.due_days,
    )
    .execute(&mut *conn)
    .await?;
    Ok(was)
}

/// The tenant's billing address ("" when none).
pub async fn billing_address(db: impl PgExecutor<'_>, tenant: Uuid) -> sqlx::Result<String> {
    Ok(
        sqlx::query_scalar!("SELECT billing_address FROM tenants WHERE id = $1", tenant)
            .fetch_optional(db)
            .await?
            .unwrap_or_default(),
    )
}

/// Replaces the tenant's billing address; returns the one it replaced (`None`: no such tenant).
pub async fn set_billing_address(
    conn: &mut PgConnection,
    tenant: Uuid,
    address: &str,
) -> sqlx::Result<Option<String>> {
    let was = sqlx::query_scalar!(
        "SELECT billing_address FROM tenants WHERE id = $1 FOR UPDATE",
        tenant
    )
    .fetch_optional(&mut *conn)
    .await?;
    if was.is_some() {
        sqlx::query!(
            "UPDATE tenants SET billing_address = $2 WHERE id = $1",
            tenant,
            address
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(was)
}
