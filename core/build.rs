//! `sqlx::migrate!` embeds the migrations at compile time; this makes a new or changed migration
//! rebuild the crate (cargo would not notice otherwise).
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
