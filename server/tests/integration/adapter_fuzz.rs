//! A fuzz run of the safetensors header reader (issue 14): random bytes and mutations of valid
//! adapter files (bit flips, splices, truncations, rewritten length prefixes) must be accepted or
//! refused, never panic, and never make the reader take more than the bounded header it accepts,
//! whatever length the file claims. Seeded, so a failure reproduces; `TF_FUZZ_ITERS` runs longer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::io::Read;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenfactory::adapter_check::config::BaseConfig;
use tokenfactory::adapter_check::safetensors::{read_header, MAX_HEADER_BYTES};
use tokenfactory::fleet::local_sim;
use tokenfactory::lifecycle::fixture;

/// A reader that counts what is taken from it.
struct Counting<'a> {
    inner: &'a [u8],
    taken: u64,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n as u64;
        Ok(n)
    }
}

fn mutate(rng: &mut StdRng, seed: &[u8]) -> Vec<u8> {
    let mut out = seed.to_vec();
    match rng.gen_range(0..6) {
        0 => {
            // Random bytes of a random length.
            let len = rng.gen_range(0..512);
            out = (0..len).map(|_| rng.r#gen()).collect();
        }
        1 => {
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..out.len());
                out[i] ^= 1 << rng.gen_range(0..8);
            }
        }
        2 => out.truncate(rng.gen_range(0..out.len())),
        3 => {
            // A new length prefix: small, near the real one, or enormous.
            let len: u64 = match rng.gen_range(0..3) {
                0 => rng.gen_range(0..64),
                1 => u64::from_le_bytes(out[..8].try_into().unwrap())
                    .wrapping_add(rng.gen_range(0..16))
                    .wrapping_sub(8),
                _ => rng.r#gen(),
            };
            out[..8].copy_from_slice(&len.to_le_bytes());
        }
        4 => {
            // Overwrite a digit inside the JSON header (shapes, offsets).
            let header_end = out.len().min(8 + 4096);
            let digits: Vec<usize> = (8..header_end)
                .filter(|i| out[*i].is_ascii_digit())
                .collect();
            if let Some(i) = digits.get(rng.gen_range(0..digits.len().max(1))) {
                out[*i] = b'0' + rng.gen_range(0..10);
            }
        }
        _ => {
            // Splice a random slice of the file somewhere else.
            let a = rng.gen_range(0..out.len());
            let b = rng.gen_range(a..out.len());
            let piece = out[a..b].to_vec();
            let at = rng.gen_range(0..out.len());
            out.splice(at..at, piece);
        }
    }
    out
}

#[test]
fn the_header_reader_survives_random_and_mutated_files() {
    let iters: usize = std::env::var("TF_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let base: BaseConfig = serde_json::from_value(local_sim::sim_base_config()).unwrap();
    let (_, seed) = fixture::valid("x/y", &base, 8);
    assert!(read_header(&seed[..], seed.len() as u64).is_ok());
    let mut rng = StdRng::seed_from_u64(0x7f_a11d);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..iters {
        let bytes = mutate(&mut rng, &seed);
        // Claim the real length, or a lie up to far beyond it.
        let claimed = if rng.gen_bool(0.8) {
            bytes.len() as u64
        } else {
            rng.gen_range(0..u64::MAX / 2)
        };
        let mut reader = Counting {
            inner: &bytes,
            taken: 0,
        };
        match read_header(&mut reader, claimed) {
            Ok(_) => accepted += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
        }
        assert!(
            reader.taken <= 8 + MAX_HEADER_BYTES,
            "took {} bytes",
            reader.taken
        );
    }
    assert_eq!(accepted + refused, iters);
    assert!(
        refused > iters / 2,
        "mutations are mostly refused ({refused}/{iters})"
    );
}
