//! The messages admin forms leave for the next page (a code in the flash cookie, never text; see
//! [`super::cookies`]). Its own module, like `model_flash`, so the cookie code depends on no
//! admin feature.

/// A message an admin form leaves for the next page (a code in the flash cookie, never text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminFlash {
    TenantCreated,
    TenantExists,
    TenantNameInvalid,
    /// The first user's email is not an address or is taken.
    UserInvalid,
    TenantSuspended,
    TenantReactivated,
    NoSuchTenant,
    LimitsSaved,
    /// A limit was neither empty, `none`, nor a non-negative integer: nothing was changed.
    LimitsInvalid,
    NoSuchKey,
    NoSuchUser,
    PasswordReset,
    SessionsEnded,
    /// An admin's own password is not reset from the users list (it would end this session).
    NotYourself,
    /// A base's cost version was appended.
    CostSaved,
    /// A cost field was not a whole number in range, or the time did not parse.
    CostInvalid,
    /// The base already has a cost version from that instant.
    CostExists,
    NoSuchBase,
    /// The invoice issuer's details were saved.
    IssuerSaved,
    /// An issuer field was empty, too long, or the terms out of 0 to 365 days.
    IssuerInvalid,
    /// A price version was appended.
    PriceSaved,
    /// A rate was not a whole number of 0 or more, the key or tier was empty or unknown, the
    /// time did not parse, or it was not after the latest version's.
    PriceInvalid,
    TierSaved,
    TierInvalid,
    DraftBuilt,
    /// The month already has an issued invoice (correct it first).
    MonthIssued,
    InvoiceIssued,
    InvoiceNotDraft,
    /// Issue refused: the period has not ended, or the draft was built before its end.
    PeriodOpen,
    /// A month was closed early.
    PeriodClosed,
    /// The close's month or instant did not parse, is not inside the month, or the month is
    /// issued or closed already.
    CloseInvalid,
    /// A re-rate run given for a draft is not the tenant's, not in the month, or overlaps another.
    RunRefused,
    /// A price version dated before now or before the last recorded event.
    PriceBackdated,
    NoSuchInvoice,
    /// A month, an adjustment's amount or its description did not parse, or the invoice is not
    /// a draft.
    InvoiceInvalid,
    AdjustmentSaved,
    CreditGranted,
    CreditInvalid,
    /// A base's sleep policy was set.
    IdleSaved,
    /// The idle duration did not parse or was out of range.
    IdleInvalid,
    /// A base's floor and idle policy were set from the advisor.
    PolicyApplied,
    /// The floor was not 1 to the base's ceiling, or the idle time out of range.
    PolicyInvalid,
}

impl AdminFlash {
    /// Whether it reports something done (the success style) rather than a refusal.
    pub fn ok(self) -> bool {
        matches!(
            self,
            Self::TenantCreated
                | Self::TenantSuspended
                | Self::TenantReactivated
                | Self::LimitsSaved
                | Self::PasswordReset
                | Self::SessionsEnded
                | Self::CostSaved
                | Self::PriceSaved
                | Self::IssuerSaved
                | Self::TierSaved
                | Self::DraftBuilt
                | Self::InvoiceIssued
                | Self::PeriodClosed
                | Self::AdjustmentSaved
                | Self::CreditGranted
                | Self::IdleSaved
                | Self::PolicyApplied
        )
    }
}

const CODES: &[(AdminFlash, &str)] = &[
    (AdminFlash::TenantCreated, "tenant-created"),
    (AdminFlash::TenantExists, "tenant-exists"),
    (AdminFlash::TenantNameInvalid, "tenant-name"),
    (AdminFlash::UserInvalid, "user-invalid"),
    (AdminFlash::TenantSuspended, "tenant-suspended"),
    (AdminFlash::TenantReactivated, "tenant-reactivated"),
    (AdminFlash::NoSuchTenant, "no-such-tenant"),
    (AdminFlash::LimitsSaved, "limits-saved"),
    (AdminFlash::LimitsInvalid, "limits-invalid"),
    (AdminFlash::NoSuchKey, "no-such-key"),
    (AdminFlash::NoSuchUser, "no-such-user"),
    (AdminFlash::PasswordReset, "password-reset"),
    (AdminFlash::SessionsEnded, "sessions-ended"),
    (AdminFlash::NotYourself, "not-yourself"),
    (AdminFlash::CostSaved, "cost-saved"),
    (AdminFlash::CostInvalid, "cost-invalid"),
    (AdminFlash::CostExists, "cost-exists"),
    (AdminFlash::NoSuchBase, "no-such-base"),
    (AdminFlash::PriceSaved, "price-saved"),
    (AdminFlash::IssuerSaved, "issuer-saved"),
    (AdminFlash::IssuerInvalid, "issuer-invalid"),
    (AdminFlash::PriceInvalid, "price-invalid"),
    (AdminFlash::TierSaved, "tier-saved"),
    (AdminFlash::TierInvalid, "tier-invalid"),
    (AdminFlash::DraftBuilt, "draft-built"),
    (AdminFlash::MonthIssued, "month-issued"),
    (AdminFlash::InvoiceIssued, "invoice-issued"),
    (AdminFlash::InvoiceNotDraft, "invoice-not-draft"),
    (AdminFlash::PeriodOpen, "period-open"),
    (AdminFlash::PeriodClosed, "period-closed"),
    (AdminFlash::CloseInvalid, "close-invalid"),
    (AdminFlash::RunRefused, "run-refused"),
    (AdminFlash::PriceBackdated, "price-backdated"),
    (AdminFlash::NoSuchInvoice, "no-such-invoice"),
    (AdminFlash::InvoiceInvalid, "invoice-invalid"),
    (AdminFlash::AdjustmentSaved, "adjustment-saved"),
    (AdminFlash::CreditGranted, "credit-granted"),
    (AdminFlash::CreditInvalid, "credit-invalid"),
    (AdminFlash::IdleSaved, "idle-saved"),
    (AdminFlash::IdleInvalid, "idle-invalid"),
    (AdminFlash::PolicyApplied, "policy-applied"),
    (AdminFlash::PolicyInvalid, "policy-invalid"),
];

impl AdminFlash {
    /// The cookie's value (after `admin-`).
    pub fn code(self) -> &'static str {
        CODES
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("", |(_, c)| c)
    }

    pub fn parse(code: &str) -> Option<Self> {
        CODES.iter().find(|(_, c)| *c == code).map(|(f, _)| *f)
    }

    /// What the page shows.
    pub fn message(self) -> &'static str {
        match self {
            Self::TenantCreated => "Tenant created.",
            Self::TenantExists => "A tenant with that handle already exists: nothing was created.",
            Self::TenantNameInvalid => {
                "A handle is 1 to 63 of a-z, 0-9, '-' and '_', starting with a letter or digit."
            }
            Self::UserInvalid => {
                "The first user's email is not an address or is taken: nothing was created."
            }
            Self::TenantSuspended => {
                "Tenant suspended: its keys are refused within a second and its users signed out."
            }
            Self::TenantReactivated => "Tenant reactivated: its keys work again.",
            Self::NoSuchTenant => "No such tenant: nothing was changed.",
            Self::LimitsSaved => "Limits saved: every server applies them within a second.",
            Self::LimitsInvalid => {
                "A limit must be empty (no limit) or a whole number of 0 or more (the spend \
                 limit: dollars, like 5 or 0.50): nothing was changed."
            }
            Self::NoSuchKey => "No such key of this tenant: nothing was changed.",
            Self::NoSuchUser => "No such user: nothing was changed.",
            Self::PasswordReset => {
                "Password reset and the user's sessions ended. Copy the new password below."
            }
            Self::SessionsEnded => "The user's portal sessions were ended.",
            Self::NotYourself => "Change your own password from your settings, not here.",
            Self::CostSaved => "Cost version saved: days from its time on are computed with it.",
            Self::CostInvalid => {
                "GPU cost is whole micro-units of 0 or more, GPUs and peak tokens per second whole \
                 numbers above 0, and the time YYYY-MM-DDTHH:MM (UTC): nothing was saved."
            }
            Self::CostExists => {
                "That base already has a cost version from that time: nothing was saved."
            }
            Self::NoSuchBase => "No such base model: nothing was saved.",
            Self::PriceSaved => {
                "Price version saved: events from its time on are rated with it; earlier \
                 versions are kept."
            }
            Self::PriceInvalid => {
                "Rates are dollars per million tokens (0 or more, at most six decimals), the \
                 model and tier must exist, and the time (YYYY-MM-DDTHH:MM, UTC) must be after \
                 the latest version's: nothing was saved."
            }
            Self::TierSaved => "Tier saved.",
            Self::TierInvalid => {
                "No such tier, or not a valid tier name (a-z, 0-9, '-', '_'): nothing was changed."
            }
            Self::DraftBuilt => "Draft built from the usage rated so far.",
            Self::MonthIssued => {
                "That month already has an issued invoice: correct it before building again."
            }
            Self::InvoiceIssued => "Invoice issued: it can no longer change.",
            Self::InvoiceNotDraft => "That invoice is already issued: nothing was changed.",
            Self::PeriodOpen => {
                "Not issued: a month is issued after its period has ended and its final draft \
                 (built after the end) is built. Close the month early to end it sooner."
            }
            Self::PeriodClosed => {
                "Month closed: its invoice covers usage started before that instant; what \
                 starts after it is on the next month's invoice."
            }
            Self::CloseInvalid => {
                "A close names a month (YYYY-MM) and an instant inside it (YYYY-MM-DDTHH:MM, \
                 UTC); an issued or already closed month cannot be closed: nothing was changed."
            }
            Self::RunRefused => {
                "Runs are this tenant's re-rate run numbers (or \"live\"), each touching the \
                 month and not overlapping another: nothing was built."
            }
            Self::PriceBackdated => {
                "A price version starts now or later, after the last recorded event: nothing \
                 was saved. To correct charges already rated, re-rate the tenant and period \
                 under a version and build the draft from that run."
            }
            Self::NoSuchInvoice => "No such invoice: nothing was changed.",
            Self::InvoiceInvalid => {
                "A month is YYYY-MM; an adjustment needs a description and a non-zero amount in \
                 dollars (at most six decimals; negative refunds), on a draft: nothing was \
                 changed."
            }
            Self::AdjustmentSaved => "Adjustment added to the draft.",
            Self::CreditGranted => "Credit granted.",
            Self::CreditInvalid => {
                "A grant is an amount in dollars above 0 (at most six decimals), a whole \
                 priority, and an expiry of YYYY-MM-DDTHH:MM (UTC) in the future or none: \
                 nothing was granted."
            }
            Self::IssuerSaved => {
                "Issuer saved: invoices issued from now on carry it; issued ones keep theirs."
            }
            Self::IssuerInvalid => {
                "The issuer needs a name (at most 200 characters), an address of at most 1,000 \
                 characters and payment terms of 0 to 365 days: nothing was saved."
            }
            Self::IdleSaved => {
                "Sleep policy saved: the fleet controller applies it on its next pass."
            }
            Self::IdleInvalid => {
                "Choose always on, or idle after 1 s to 30 days (90, 90s, 10m, 1h30m): nothing \
                 was saved."
            }
            Self::PolicyApplied => {
                "Serving policy applied (floor and sleep policy, audited): the fleet controller \
                 rolls it out on its next pass, and a restart keeps it."
            }
            Self::PolicyInvalid => {
                "A floor is 1 to the base's ceiling and an idle time 1 s to 30 days (or always \
                 on): nothing was changed."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_round_trip() {
        for (f, c) in CODES {
            assert_eq!(AdminFlash::parse(c), Some(*f));
            assert_eq!(f.code(), *c);
        }
        assert_eq!(AdminFlash::parse("nonsense"), None);
    }
}
