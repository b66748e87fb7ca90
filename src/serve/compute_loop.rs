//! The compute thread's loop, one for every model kind: wait for work outside the rayon pool
//! when idle (so an idle server holds no pool thread), and while busy take what has arrived
//! and work on a pool thread (the many small parallel loops of a step then start without a
//! hand-off), until nothing runs or waits.

use std::sync::mpsc::Receiver;

/// What the compute thread drives: an engine ([`super::engine::Engine`]) or the job runner
/// of translation and encoder models ([`super::jobs`]).
pub trait Worker: Send {
    /// What arrives through the channel.
    type Input: Send;
    /// Takes one arrival.
    fn take(&mut self, input: Self::Input);
    /// One unit of work (an engine step); false when there was nothing to do.
    fn work(&mut self) -> bool;
    /// Nothing running and nothing waiting.
    fn is_idle(&self) -> bool;
}

/// Runs `worker` until `inputs` is closed and everything taken is done.
pub fn run<W: Worker>(worker: &mut W, mut inputs: Receiver<W::Input>) {
    while let Ok(input) = inputs.recv() {
        worker.take(input);
        // The receiver moves to the pool thread and back (it is Send, not Sync).
        let worker = &mut *worker;
        inputs = rayon::scope(move |_| {
            busy(worker, &inputs);
            inputs
        });
    }
}

/// Takes what has arrived and works, until nothing runs or waits.
fn busy<W: Worker>(worker: &mut W, inputs: &Receiver<W::Input>) {
    loop {
        while let Ok(input) = inputs.try_recv() {
            worker.take(input);
        }
        if !worker.work() {
            if worker.is_idle() {
                return;
            }
            // Everything waiting waits for room that only a finishing row frees, and nothing
            // runs: cannot happen while the HTTP layer checks each request against the pool;
            // avoid spinning if it does.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
