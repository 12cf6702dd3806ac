//! The processes a run starts (QUIC ranks, gloo ranks): each is registered so Ctrl-C can end
//! it, and any still running when the run ends early (an error, a rank that failed to start)
//! is killed and reaped, never left behind.

use std::process::{Child, Command, Output};
use std::sync::Mutex;

use anyhow::{Context, Result};

/// Every process started so far, for the Ctrl-C handler.
static STARTED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The ids of every process started so far.
pub(crate) fn started() -> Vec<u32> {
    STARTED.lock().map(|p| p.clone()).unwrap_or_default()
}

/// Processes started together, waited for in order.
#[derive(Default)]
pub(crate) struct Processes(Vec<Child>);

impl Processes {
    /// Starts `command` as one more of them; its process id.
    pub(crate) fn spawn(&mut self, command: &mut Command) -> Result<u32> {
        let child = command.spawn().with_context(|| format!("starting {:?}", command.get_program()))?;
        let pid = child.id();
        if let Ok(mut started) = STARTED.lock() {
            started.push(pid);
        }
        self.0.push(child);
        Ok(pid)
    }

    /// Waits for each in the order started; their exit statuses and output.
    pub(crate) fn wait_all(mut self) -> Result<Vec<Output>> {
        let mut outputs = Vec::with_capacity(self.0.len());
        while !self.0.is_empty() {
            // Taken one at a time, so those not yet waited for are still killed on an error.
            outputs.push(self.0.remove(0).wait_with_output()?);
        }
        Ok(outputs)
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
