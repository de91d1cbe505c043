//! The messages the `/models` forms leave for the next page (a code in the flash cookie, never
//! text; see [`super::cookies`]).

/// What a model form did, shown once on `/models`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFlash {
    /// Uploaded and validated: it may be started.
    Uploaded,
    /// Uploaded but refused by validation (the reason is in the adapter's row).
    Rejected,
    /// The name is not a usable model name.
    NameInvalid,
    /// The base is not offered for adapters.
    BaseUnknown,
    /// The form lacked a field or a file, or was not multipart.
    UploadInvalid,
    /// The model's current state does not allow that (being uploaded, rejected, deleted, running).
    Busy,
    Started,
    Stopped,
    Deleted,
    /// Delete was posted without ticking the confirmation.
    DeleteUnconfirmed,
    /// A read-only member posted a form: refused, nothing changed.
    ReadOnly,
}

const CODES: &[(ModelFlash, &str)] = &[
    (ModelFlash::Uploaded, "uploaded"),
    (ModelFlash::Rejected, "rejected"),
    (ModelFlash::NameInvalid, "name"),
    (ModelFlash::BaseUnknown, "base"),
    (ModelFlash::UploadInvalid, "upload"),
    (ModelFlash::Busy, "busy"),
    (ModelFlash::Started, "started"),
    (ModelFlash::Stopped, "stopped"),
    (ModelFlash::Deleted, "deleted"),
    (ModelFlash::DeleteUnconfirmed, "unconfirmed"),
    (ModelFlash::ReadOnly, "read-only"),
];

impl ModelFlash {
    /// The cookie's value (after `model-`).
    pub fn code(self) -> &'static str {
        CODES
            .iter()
            .find(|(f, _)| *f == self)
            .map_or("busy", |(_, c)| c)
    }

    pub fn parse(code: &str) -> Option<Self> {
        CODES.iter().find(|(_, c)| *c == code).map(|(f, _)| *f)
    }

    /// Whether it reports something done (the success style) rather than a refusal.
    pub fn ok(self) -> bool {
        matches!(
            self,
            Self::Uploaded | Self::Started | Self::Stopped | Self::Deleted
        )
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::Uploaded => "Adapter uploaded and validated. Start it to serve it.",
            Self::Rejected => {
                "The adapter was rejected: the reason is shown in its row below. Nothing will \
                 be served from it."
            }
            Self::NameInvalid => {
                "A model name is 1 to 64 letters, digits, '-', '_' or '.', starting with a \
                 letter or digit."
            }
            Self::BaseUnknown => "That base model does not accept adapters.",
            Self::UploadInvalid => {
                "Give a name, a base and both files (adapter_config.json and \
                 adapter_model.safetensors)."
            }
            Self::Busy => {
                "That model cannot do this in its current state (still uploading, rejected, \
                 running or being deleted): nothing was changed."
            }
            Self::Started => "Starting: the model is served as soon as it is ready.",
            Self::Stopped => "Stopped: the model is no longer served.",
            Self::Deleted => "Deleted: the model and its files are being removed.",
            Self::DeleteUnconfirmed => "Tick the confirmation to delete: nothing was changed.",
            Self::ReadOnly => {
                "Your role is read-only: you can see the models but not change them. Nothing \
                 was changed."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (f, c) in CODES {
            assert_eq!(ModelFlash::parse(c), Some(*f));
            assert_eq!(f.code(), *c);
        }
        assert_eq!(ModelFlash::parse("nonsense"), None);
    }
}
