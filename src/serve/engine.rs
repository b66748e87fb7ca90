//! Continuous batching, written once for every kind of model (Orca's iteration-level
//! scheduling, Yu et al. 2022, over vLLM-style paged KV memory, Kwon et al. 2023).
//!
//! A request brings one or more *rows* (a language model: its one sequence; a translation
//! model: one row per sentence). The engine holds one running batch of rows in the model's
//! state; every iteration ([`Engine::step`]):
//! 1. drops the requests whose client went away (their reply channel is closed) or whose
//!    deadline passed ([`Reply::timed_out`]), queued or running: their rows leave the state and
//!    their blocks return to the free lists at once;
//! 2. admits waiting rows, first come first served, while the batch has room
//!    (`max_batch` rows), the pool has the row's blocks (`reserved + blocks ≤ pool_blocks`,
//!    reserved at admission for the row's whole life, so a running row never waits for memory
//!    and is never preempted; not checked where there is no pool) and the kind's own per-step
//!    budget lasts ([`RowKind::fits`]). **Fair admission** (bounded skipping): the oldest row
//!    whose blocks are not free lets later rows that fit go ahead of it, but at most
//!    `max_overtakes` of them over its wait ([`Limits::max_overtakes`]); from then on nothing
//!    passes it, and it is admitted as soon as running rows have returned its blocks. So a
//!    large request cannot hold small ones behind it for its whole wait, and small ones cannot
//!    starve it. A row that does not fit the batch or the kind's budget stops admission. The
//!    admitted rows start together ([`RowKind::start`]);
//! 3. runs ONE model step over the running rows ([`RowKind::step`]), which chooses each
//!    row's next token and says which rows are done;
//! 4. sends the tokens ([`Reply::token`]; a client found gone leaves now), retires the rows
//!    that are done ([`RowKind::keep_rows`]: their blocks return at once) and answers every
//!    request whose last row is done ([`Reply::answer`]), only then: a client that has its
//!    answer sees its blocks freed and its latencies counted.
//!
//! What differs between the kinds (how rows start, the model call, how tokens are chosen and
//! rows end, what an answer is) lives in a [`RowKind`] adapter: [`super::scheduler`] (language
//! models) and [`super::translate_engine`] (translation).
//!
//! Metrics: a request leaves the queue (`transformer_queue_length`, queue time) when its first
//! row is admitted; its first token is the first token of any of its rows; its time per output
//! token is `(end − first token) / (steps − 1)` over the steps that gave it tokens, and every
//! gap between two such steps is an inter-token latency; its
//! end-to-end latency is observed when answered or dropped once admitted (a request dropped
//! while queued counts one only where [`RowKind::LATENCY_OF_QUEUED_DROPS`]). The gauges are
//! set after the model step, before any token goes out (a client that reads its first token
//! and then `/metrics` sees its rows running and its blocks held), and again after retirement.

use super::compute_loop::{self, Worker};
use super::metrics::{EngineGauges, Latency, Metrics};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

/// Where a request's tokens and answer go.
pub trait Reply {
    /// One row's answer.
    type Answer;
    /// The client went away (the engine drops the request).
    fn is_closed(&self) -> bool;
    /// The deadline passed first.
    fn timed_out(self);
    /// Refused at submission, with the message of a 400.
    fn refuse(self, message: String);
    /// A row's next token; false when nobody listens any more.
    fn token(&self, token: u32) -> bool;
    /// Every row's answer, in the request's order of rows.
    fn answer(self, answers: Vec<Self::Answer>);
}

/// A request split into its rows, as [`RowKind::plan`] gives it.
pub struct Plan<K: RowKind + ?Sized> {
    pub reply: K::Reply,
    /// When it arrived.
    pub arrived: Instant,
    /// When the engine gives up on it.
    pub deadline: Instant,
    /// Per row, in the request's order: waiting to be decoded or answered already; `Err`
    /// refuses the whole request with this message.
    pub rows: Result<Vec<PlannedRow<K>>, String>,
}

/// A row of a [`Plan`] of kind `K`.
pub type PlannedRow<K> = RowPlan<<K as RowKind>::Pending, <K as RowKind>::Answer>;

/// One row of a [`Plan`].
pub enum RowPlan<P, A> {
    /// Waits for admission.
    Decode(P),
    /// Answered without decoding.
    Answered(A),
}

/// What a model step did to one row.
pub enum Advance<A> {
    /// No token this step (a prompt still being fed).
    Nothing,
    /// The next token; the row goes on.
    Token(u32),
    /// The row's last token, and its answer.
    Last(u32, A),
    /// The row ends without a token (it failed), with its answer.
    Ended(A),
}

/// The outcome of [`RowKind::step`].
pub struct Stepped<A> {
    /// Prompt tokens fed by the step.
    pub fed: usize,
    /// One per running row, in the state's order.
    pub rows: Vec<Advance<A>>,
}

/// What one kind of model does for the engine (see the module docs). Row `r` of the running
/// batch is row `r` of the kind's state.
pub trait RowKind {
    /// A request as the HTTP layer hands it over.
    type Request;
    /// Where its tokens and answer go.
    type Reply: Reply<Answer = Self::Answer>;
    /// A row waiting for admission.
    type Pending;
    /// A row of the running batch.
    type Row;
    /// A finished row's answer.
    type Answer;

    /// Whether a request dropped while queued counts an end-to-end latency.
    const LATENCY_OF_QUEUED_DROPS: bool;

    /// Splits a request into its rows (or refuses it).
    fn plan(&self, request: Self::Request) -> Plan<Self>;

    /// KV blocks a row reserves at admission (0 where the kind has no pool).
    fn blocks(&self, pending: &Self::Pending) -> usize;

    /// Whether `next` joins `admitted` within this step's admission budget (beyond the batch
    /// and the pool).
    fn fits(&self, admitted: &[Self::Pending], next: &Self::Pending) -> bool;

    /// Starts `admitted` at the end of the state, in order; their rows, and the prompt tokens
    /// fed in doing so.
    fn start(&mut self, admitted: Vec<Self::Pending>) -> (Vec<Self::Row>, usize);

    /// One model step over the running rows; `None` when there was nothing to feed.
    fn step(&mut self, rows: &mut [Self::Row]) -> Option<Stepped<Self::Answer>>;

    /// Keeps the state's rows `kept` (ascending); the others' blocks return to the free lists.
    fn keep_rows(&mut self, kept: &[usize]);

    /// Blocks held now.
    fn blocks_in_use(&self) -> usize;

    /// Blocks no row holds that are kept for a later row to take back (prefix caching); none
    /// by default.
    fn blocks_kept(&self) -> usize {
        0
    }
}

/// Sizes common to every kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Rows in the running batch at most.
    pub max_batch: usize,
    /// Blocks the rows may reserve together; `None`: no pool limit.
    pub pool_blocks: Option<usize>,
    /// Later rows admitted ahead of a row waiting for blocks before nothing passes it any more
    /// (0: strict first come, first served).
    pub max_overtakes: usize,
}

/// A request being answered.
struct Tracked<R: Reply> {
    reply: R,
    arrived: Instant,
    deadline: Instant,
    /// Per row its answer, once done.
    answers: Vec<Option<R::Answer>>,
    /// Rows not done yet.
    left: usize,
    /// Whether a row has been admitted (the request has left the queue).
    admitted: bool,
    first_token: Option<Instant>,
    /// When its latest tokens came (the inter-token latency is measured from it).
    last_token: Option<Instant>,
    /// Steps that gave it tokens.
    steps: usize,
}

/// Where a row belongs.
#[derive(Clone, Copy, Debug)]
struct Slot {
    request: u64,
    /// Its index among the request's rows.
    index: usize,
    /// Blocks reserved for it.
    blocks: usize,
    /// Later rows admitted ahead of it while it waited for blocks.
    overtaken: usize,
}

/// The continuous-batching engine over one kind of model (see the module docs).
pub struct Engine<K: RowKind> {
    kind: K,
    limits: Limits,
    /// The running rows and, beside them, where each belongs.
    rows: Vec<K::Row>,
    slots: Vec<Slot>,
    waiting: VecDeque<(Slot, K::Pending)>,
    requests: BTreeMap<u64, Tracked<K::Reply>>,
    next_id: u64,
    reserved: usize,
    metrics: Arc<Metrics>,
}

impl<K: RowKind> Engine<K> {
    /// An engine over `kind`, its gauges published.
    pub fn with_kind(kind: K, limits: Limits, metrics: Arc<Metrics>) -> Self {
        let engine = Engine {
            kind,
            limits,
            rows: Vec::new(),
            slots: Vec::new(),
            waiting: VecDeque::new(),
            requests: BTreeMap::new(),
            next_id: 0,
            reserved: 0,
            metrics,
        };
        engine.metrics.set_gauges(engine.gauges());
        engine
    }

    /// Queues a request (the HTTP layer counted it in `metrics.queued` and checked its
    /// limits). A request the kind refuses is answered at once, and so is one whose rows are
    /// all answered without decoding.
    pub fn submit(&mut self, request: K::Request) {
        let plan = self.kind.plan(request);
        let rows = match plan.rows {
            Ok(rows) => rows,
            Err(message) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                plan.reply.refuse(message);
                return;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut answers = Vec::with_capacity(rows.len());
        for (index, row) in rows.into_iter().enumerate() {
            match row {
                RowPlan::Answered(answer) => answers.push(Some(answer)),
                RowPlan::Decode(pending) => {
                    answers.push(None);
                    let blocks = self.kind.blocks(&pending);
                    let slot = Slot {
                        request: id,
                        index,
                        blocks,
                        overtaken: 0,
                    };
                    self.waiting.push_back((slot, pending));
                }
            }
        }
        let left = answers.iter().filter(|a| a.is_none()).count();
        let request = Tracked {
            reply: plan.reply,
            arrived: plan.arrived,
            deadline: plan.deadline,
            answers,
            left,
            admitted: false,
            first_token: None,
            last_token: None,
            steps: 0,
        };
        if left > 0 {
            self.requests.insert(id, request);
            return;
        }
        self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        let now = Instant::now();
        let waited = (now - request.arrived).as_secs_f64();
        self.metrics.observe(Latency::QueueTime, waited);
        self.observe_end(&request, now);
        Self::answer(request);
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.waiting.is_empty()
    }

    /// Rows in the running batch.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn running(&self) -> usize {
        self.rows.len()
    }

    /// Rows waiting for admission.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Blocks in use now.
    pub fn blocks_in_use(&self) -> usize {
        self.kind.blocks_in_use()
    }

    fn gauges(&self) -> EngineGauges {
        let used = self.blocks_in_use();
        EngineGauges {
            running: self.rows.len(),
            kv_blocks_used: used,
            kv_blocks_free: self
                .limits
                .pool_blocks
                .map_or(0, |p| p.saturating_sub(used)),
            kv_blocks_reserved: self.reserved,
            kv_blocks_cached: self.kind.blocks_kept(),
        }
    }

    /// Observes a finished request's time per output token and end-to-end latency.
    fn observe_end(&self, request: &Tracked<K::Reply>, now: Instant) {
        if let Some(first) = request.first_token {
            if request.steps > 1 {
                let per_token = (now - first).as_secs_f64() / (request.steps - 1) as f64;
                self.metrics.observe(Latency::TimePerOutputToken, per_token);
            }
        }
        let e2e = (now - request.arrived).as_secs_f64();
        self.metrics.observe(Latency::EndToEnd, e2e);
    }

    /// Sends a finished request its answers.
    fn answer(request: Tracked<K::Reply>) {
        let answers = request.answers.into_iter().flatten().collect();
        request.reply.answer(answers);
    }

    /// Removes request `id` without an answer (its client went away, or its deadline passed:
    /// `timed_out`); its rows are left for [`Self::retire_rows`].
    fn abandon(&mut self, id: u64, now: Instant, timed_out: bool) {
        let Some(request) = self.requests.remove(&id) else {
            return;
        };
        if !request.admitted {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        }
        if request.admitted || K::LATENCY_OF_QUEUED_DROPS {
            let e2e = (now - request.arrived).as_secs_f64();
            self.metrics.observe(Latency::EndToEnd, e2e);
        }
        if timed_out {
            request.reply.timed_out();
        }
    }

    /// Keeps the running rows whose `keep` is set; the others leave the state, their blocks
    /// freed and their reservations returned.
    fn retire(&mut self, keep: &[bool]) {
        if keep.iter().all(|&k| k) {
            return;
        }
        let kept: Vec<usize> = (0..keep.len()).filter(|&r| keep[r]).collect();
        self.kind.keep_rows(&kept);
        for (slot, _) in self.slots.iter().zip(keep).filter(|(_, &k)| !k) {
            self.reserved = self.reserved.saturating_sub(slot.blocks);
        }
        let mut k = keep.iter();
        self.slots.retain(|_| *k.next().unwrap_or(&false));
        let mut k = keep.iter();
        self.rows.retain(|_| *k.next().unwrap_or(&false));
    }

    /// Retires the running rows whose `keep` is unset or whose request is no longer tracked,
    /// and forgets the waiting rows of the latter.
    fn retire_rows(&mut self, mut keep: Vec<bool>) {
        for (k, slot) in keep.iter_mut().zip(&self.slots) {
            *k &= self.requests.contains_key(&slot.request);
        }
        self.retire(&keep);
        let requests = &self.requests;
        self.waiting
            .retain(|(s, _)| requests.contains_key(&s.request));
    }

    /// Drops the requests whose client went away or whose deadline passed.
    fn drop_abandoned(&mut self, now: Instant) {
        let gone: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.reply.is_closed() || r.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in gone {
            let timed_out = self.requests.get(&id).is_some_and(|r| r.deadline <= now);
            self.abandon(id, now, timed_out);
        }
        self.retire_rows(vec![true; self.rows.len()]);
    }

    /// Admits waiting rows (see the module docs) and starts them; returns the prompt tokens
    /// their start fed.
    fn admit(&mut self, now: Instant) -> usize {
        let mut admitted: Vec<K::Pending> = Vec::new();
        // The oldest waiting row whose blocks are not free, once passed over.
        let mut blocked: Option<usize> = None;
        let mut i = 0;
        while let Some((slot, next)) = self.waiting.get(i) {
            if self.rows.len() + admitted.len() >= self.limits.max_batch {
                break;
            }
            let fits_pool = self
                .limits
                .pool_blocks
                .is_none_or(|pool| self.reserved + slot.blocks <= pool);
            if !fits_pool {
                if blocked.is_none() {
                    if slot.overtaken >= self.limits.max_overtakes {
                        // Its turn: nothing passes it.
                        break;
                    }
                    blocked = Some(i);
                }
                i += 1;
                continue;
            }
            if !self.kind.fits(&admitted, next) {
                break;
            }
            let Some((slot, next)) = self.waiting.remove(i) else {
                break;
            };
            // `b < i`: the removal left it in place.
            let passed = blocked.and_then(|b| self.waiting.get_mut(b));
            let stop = passed.is_some_and(|(s, _)| {
                s.overtaken += 1;
                s.overtaken >= self.limits.max_overtakes
            });
            if let Some(r) = self.requests.get_mut(&slot.request) {
                if !r.admitted {
                    r.admitted = true;
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    let waited = (now - r.arrived).as_secs_f64();
                    self.metrics.observe(Latency::QueueTime, waited);
                }
            }
            self.reserved += slot.blocks;
            self.slots.push(slot);
            admitted.push(next);
            if stop {
                break;
            }
        }
        if admitted.is_empty() {
            return 0;
        }
        let (rows, fed) = self.kind.start(admitted);
        self.rows.extend(rows);
        fed
    }

    /// One iteration (see the module docs). Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        let now = Instant::now();
        self.drop_abandoned(now);
        let started = self.admit(now);
        if self.rows.is_empty() {
            self.metrics.set_gauges(self.gauges());
            return false;
        }
        let Some(stepped) = self.kind.step(&mut self.rows) else {
            return false;
        };
        self.metrics.set_gauges(self.gauges());
        let now = Instant::now();
        // The requests that got tokens, each once.
        let mut got: Vec<u64> = Vec::new();
        for (slot, advance) in self.slots.iter().zip(&stepped.rows) {
            let token = matches!(advance, Advance::Token(_) | Advance::Last(..));
            if token && !got.contains(&slot.request) {
                got.push(slot.request);
            }
        }
        for id in &got {
            if let Some(r) = self.requests.get_mut(id) {
                r.steps += 1;
                if let Some(last) = r.last_token.replace(now) {
                    let gap = (now - last).as_secs_f64();
                    self.metrics.observe(Latency::InterToken, gap);
                }
                if r.first_token.is_none() {
                    r.first_token = Some(now);
                    let ttft = (now - r.arrived).as_secs_f64();
                    self.metrics.observe(Latency::TimeToFirstToken, ttft);
                }
            }
        }
        // Rows done: their answers; a request whose last row is done is counted before anything
        // goes out.
        let mut keep = vec![true; self.rows.len()];
        let mut tokens: Vec<(usize, u32)> = Vec::new();
        let mut answered: Vec<u64> = Vec::new();
        let advances = self.slots.iter().zip(stepped.rows).enumerate();
        for (r, (slot, advance)) in advances {
            let answer = match advance {
                Advance::Nothing => continue,
                Advance::Token(token) => {
                    tokens.push((r, token));
                    continue;
                }
                Advance::Last(token, answer) => {
                    tokens.push((r, token));
                    answer
                }
                Advance::Ended(answer) => answer,
            };
            keep[r] = false;
            let Some(req) = self.requests.get_mut(&slot.request) else {
                continue;
            };
            if let Some(a) = req.answers.get_mut(slot.index) {
                *a = Some(answer);
            }
            req.left = req.left.saturating_sub(1);
            if req.left == 0 {
                answered.push(slot.request);
            }
        }
        for id in &answered {
            if let Some(req) = self.requests.get(id) {
                self.observe_end(req, now);
            }
        }
        // Tokens go out; a client found gone leaves now.
        let generated = tokens.len();
        for (r, token) in tokens {
            let id = self.slots[r].request;
            let Some(req) = self.requests.get(&id) else {
                continue;
            };
            if !req.reply.token(token) && !answered.contains(&id) {
                self.abandon(id, now, false);
            }
        }
        // Rows done leave; their blocks are free for the next admission. Their clients hear of
        // the end only then.
        self.retire_rows(keep);
        self.metrics
            .step(self.gauges(), started + stepped.fed, generated);
        for id in answered {
            if let Some(request) = self.requests.remove(&id) {
                Self::answer(request);
            }
        }
        true
    }
}

impl<K: RowKind> Engine<K>
where
    Self: Send,
    K::Request: Send,
{
    /// Runs until `requests` is closed and everything submitted is answered
    /// ([`compute_loop::run`]).
    pub fn run(&mut self, requests: Receiver<K::Request>) {
        compute_loop::run(self, requests);
    }
}

impl<K: RowKind> Worker for Engine<K>
where
    Self: Send,
    K::Request: Send,
{
    type Input = K::Request;
    fn take(&mut self, request: K::Request) {
        self.submit(request);
    }
    fn work(&mut self) -> bool {
        self.step()
    }
    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }
}

#[cfg(test)]
mod tests;
