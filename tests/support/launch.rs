//! Starts the processes of a job as a launcher does: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` for each (no agent store: rank 0 serves
//! the store), output to files so the job's end is the processes' exit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One launched job: its processes and their output files.
pub struct Job {
    pub children: Vec<Child>,
    pub logs: Vec<PathBuf>,
}

impl Job {
    /// Starts `n` ranks of `exe args...` with `envs`, logging under `dir`.
    pub fn start(dir: &Path, n: usize, exe: &str, args: &[&str], envs: &[(&str, &str)]) -> Job {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port().to_string();
        let mut children = Vec::new();
        let mut logs = Vec::new();
        for r in 0..n {
            let log = dir.join(format!("rank-{r}.log"));
            let f = std::fs::File::create(&log).unwrap();
            let mut c = Command::new(exe);
            c.args(args)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(f.try_clone().unwrap())
                .stderr(f);
            for (k, v) in envs {
                c.env(k, v);
            }
            children.push(
                c.spawn()
                    .unwrap_or_else(|e| panic!("cannot start {exe}: {e}")),
            );
            logs.push(log);
        }
        Job { children, logs }
    }

    /// Rank `r`'s output so far.
    pub fn log(&self, r: usize) -> String {
        std::fs::read_to_string(&self.logs[r]).unwrap_or_default()
    }

    /// Waits for every process; returns whether each succeeded, with every rank's output.
    pub fn wait(mut self) -> (Vec<bool>, String) {
        let ok = self
            .children
            .iter_mut()
            .map(|c| c.wait().unwrap().success())
            .collect();
        let text = (0..self.logs.len())
            .map(|r| format!("--- rank {r}\n{}", self.log(r)))
            .collect();
        (ok, text)
    }
}

impl Drop for Job {
    /// A test that fails (panics) leaves no rank running: every process still alive is killed.
    fn drop(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
