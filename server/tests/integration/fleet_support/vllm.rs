//! A stand-in for the `vllm` executable: a shell script that checks what vLLM needs to allow
//! runtime LoRA loading, logs how it was started, and execs `tokenfactory engine-sim` with
//! vLLM's flags mapped to the simulator's. `exec` keeps the pid, so killing the logged pid kills
//! the engine.

use std::path::PathBuf;

use tempfile::TempDir;

pub struct FakeVllm {
    pub dir: TempDir,
    pub bin: PathBuf,
    log: PathBuf,
}

/// One start of the executable, from its log.
#[derive(Debug, Clone)]
pub struct Start {
    pub pid: i32,
    pub port: u16,
    pub gpus: String,
    pub args: String,
}

impl FakeVllm {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("vllm");
        let log = dir.path().join("starts.log");
        let script = format!(
            r#"#!/bin/sh
[ "$1" = serve ] || {{ echo "usage: vllm serve MODEL [flags]" >&2; exit 2; }}
[ "$VLLM_ALLOW_RUNTIME_LORA_UPDATING" = True ] || {{ echo "runtime LoRA updating is off" >&2; exit 3; }}
all="$*"
model=$2
shift 2
host=127.0.0.1
port=8000
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift ;;
    --port) port=$2; shift ;;
    --served-model-name) model=$2; shift ;;
  esac
  shift
done
echo "$$|$port|$CUDA_VISIBLE_DEVICES|$all" >> '{log}'
exec '{tf}' engine-sim --listen "$host:$port" --models "$model"
"#,
            log = log.display(),
            tf = env!("CARGO_BIN_EXE_tokenfactory"),
        );
        std::fs::write(&bin, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir, bin, log }
    }

    /// Every start so far, oldest first.
    pub fn starts(&self) -> Vec<Start> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.splitn(4, '|');
                Some(Start {
                    pid: f.next()?.parse().ok()?,
                    port: f.next()?.parse().ok()?,
                    gpus: f.next()?.to_owned(),
                    args: f.next()?.to_owned(),
                })
            })
            .collect()
    }

    /// Ports of started engines that still accept connections.
    pub async fn listening(&self) -> Vec<u16> {
        let mut open = Vec::new();
        for s in self.starts() {
            if tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                .await
                .is_ok()
                && !open.contains(&s.port)
            {
                open.push(s.port);
            }
        }
        open
    }
}
