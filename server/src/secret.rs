//! A string that never shows itself in `Debug` or logs (URLs with passwords, API keys).

use std::fmt;
use std::str::FromStr;

/// Wraps `secrecy::SecretString` so clap can parse it and it stays cheap to clone.
#[derive(Clone)]
pub struct Secret(secrecy::SecretString);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(secrecy::SecretString::from(s.into()))
    }
    /// The value itself; call only where it is used, never to log.
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("*****")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}
