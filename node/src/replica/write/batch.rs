//! Group commit: the writes waiting on a node are proposed together as one
//! Raft entry, so concurrent writers share the log appends and fsyncs of
//! the leader and followers instead of paying one each.
//!
//! One task owns the queue. It takes the first waiting write as soon as a
//! proposal slot is free (a lone writer waits for nobody), adds whatever
//! else is already queued up to [`BATCH_MUTATIONS_MAX`] mutations and
//! [`BATCH_BYTES_MAX`] encoded bytes, and proposes the batch. At most
//! [`BATCHES_IN_FLIGHT_MAX`] batches are in Raft at once; while they are,
//! new writes gather into the next batch, so batches grow with the load.
//!
//! Every mutation is applied on its own (see [`storage::Mutation`]), so a
//! batch changes nothing about what a write does: each writer gets back
//! exactly the outcomes of its own mutations, in order. The batch's
//! `now_ms` is taken when it is proposed, on the node proposing it.
//!
//! A batch holds its slot until Raft answers it, or until this node stops
//! leading the term it was proposed in, whichever comes first. Raft keeps
//! a deposed leader's unanswered entries and answers them when they are
//! applied or truncated, but an entry that reaches this node inside a
//! snapshot is neither, and is never answered: held until then, two such
//! batches would stop every write of this node for good, even after it
//! leads again. A deposed batch still waits [`DEPOSED_ANSWER_WAIT_MS`] for
//! its answer; then its writers are told its outcome is unknown.
//!
//! Which writes go together and how outcomes are split back are plain
//! functions (`Gather`, [`split_outcomes`]), tested without Raft; the
//! slots are tested against a stand-in [`Log`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{ClientWriteError, RaftError};
use storage::{Command, Mutation, MutationResult};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::warn;

use crate::clock::Clock;
use crate::raft::{Committed, NodeId, Raft};

/// Most mutations proposed in one Raft entry.
pub const BATCH_MUTATIONS_MAX: usize = 1_024;
/// Most encoded bytes of mutations in one Raft entry; lower when the frame
/// limit is small (see [`batch_bytes_max`]).
pub const BATCH_BYTES_MAX: usize = 256 * 1024;
/// The frame limit over the batch byte limit: an entry takes at most this
/// share of an append-entries frame.
pub const FRAME_SHARE_DIVISOR: usize = 4;
/// Batches proposed and not yet committed, at most.
pub const BATCHES_IN_FLIGHT_MAX: usize = 2;
/// Writes waiting for a batch, at most; further writers wait for room.
pub const QUEUE_DEPTH: usize = 8_192;
/// How long a batch still waits for its answer once this node stopped
/// leading the term it was proposed in (its slot already freed): longer
/// than writers wait by default (`request_timeout_ms`, 5 s), so an answer
/// that comes is not lost to a writer still waiting, and bounded, so a
/// batch that is never answered is let go.
pub const DEPOSED_ANSWER_WAIT_MS: u64 = 30_000;

/// What a batch is proposed to: this node's Raft, or a stand-in in tests.
pub trait Log: Clone + Send + Sync + 'static {
    /// Proposes `command`; its log index and outcomes once it is applied.
    fn write(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<(u64, Vec<MutationResult>), WriteError>> + Send;

    /// Resolves once this node no longer leads the term it leads now (at
    /// once if it leads none). The term is taken when this is called.
    fn deposed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl Log for Raft {
    async fn write(&self, command: Command) -> Result<(u64, Vec<MutationResult>), WriteError> {
        let response = self.client_write(command).await?;
        Ok((response.log_id.index, response.data.outcomes))
    }

    fn deposed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut metrics = self.metrics();
        let (id, term) = {
            let m = metrics.borrow_and_update();
            (m.id, m.current_term)
        };
        Box::pin(async move {
            loop {
                {
                    let m = metrics.borrow_and_update();
                    if m.current_leader != Some(id) || m.current_term != term {
                        return;
                    }
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

/// What Raft said about a batch, as each of its writers receives it.
pub type WriteError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// Why a write got no outcome from the batcher.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Raft did not commit the batch.
    #[error(transparent)]
    Raft(Box<WriteError>),
    /// The batcher stopped (the node is shutting down).
    #[error("the node is shutting down")]
    Closed,
    /// This node stopped leading before its batch was answered, and no
    /// answer came within [`DEPOSED_ANSWER_WAIT_MS`]: the write may or may
    /// not have been committed.
    #[error(
        "this node stopped leading before the write was answered; it may or may not have been committed"
    )]
    Unanswered,
    /// Apply answers every mutation; anything else is a bug, and no writer
    /// may be handed another's outcome.
    #[error("the batch's outcomes do not match its mutations")]
    Mismatch,
}

/// One writer's mutations and where its outcomes go.
struct Pending {
    mutations: Vec<Mutation>,
    bytes: usize,
    reply: Reply,
}

/// The handle writers submit to; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the batching task for `log` (this node's Raft), stamping
    /// batches with `clock`; batches hold at most `bytes_max` encoded
    /// bytes of mutations.
    pub fn start(log: impl Log, clock: Arc<dyn Clock>, bytes_max: usize) -> Batcher {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(log, clock, bytes_max, receiver));
        Batcher { queue }
    }

    /// Proposes `mutations` with whatever else is waiting and returns their
    /// outcomes and the index of the entry that carried them. Cancel-safe for the caller: a dropped call's mutations
    /// may still be committed, exactly as with a direct Raft write.
    pub async fn write(&self, mutations: Vec<Mutation>) -> Result<Committed, BatchError> {
        let bytes = encoded_bytes(&mutations);
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            mutations,
            bytes,
            reply,
        };
        self.queue
            .send(pending)
            .await
            .map_err(|_| BatchError::Closed)?;
        answer.await.unwrap_or(Err(BatchError::Closed))
    }
}

/// The byte limit of a batch under the frame limit `frame_bytes_max`.
pub fn batch_bytes_max(frame_bytes_max: usize) -> usize {
    BATCH_BYTES_MAX.min(frame_bytes_max / FRAME_SHARE_DIVISOR)
}

async fn run(
    log: impl Log,
    clock: Arc<dyn Clock>,
    bytes_max: usize,
    mut receiver: mpsc::Receiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for a slot before taking writes, so that writes arriving
        // while the slots are busy gather into one batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(pending) => pending,
            None => match receiver.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let mut gather = Gather::new(first, bytes_max);
        while let Ok(next) = receiver.try_recv() {
            if let Err(next) = gather.add(next) {
                carried = Some(next);
                break;
            }
        }
        let batch = gather.finish();
        let log = log.clone();
        let now_ms = clock.now_ms();
        tokio::spawn(async move {
            let (mutations, writers) = batch;
            let sizes: Vec<usize> = writers.iter().map(|(n, _)| *n).collect();
            let result = answer(&log, Command { now_ms, mutations }, slot).await;
            let parts = result.and_then(|(log_index, outcomes)| {
                split_outcomes(&sizes, outcomes)
                    .map(|parts| (log_index, parts))
                    .ok_or_else(|| {
                        warn!("a batch's outcomes do not match its mutations");
                        BatchError::Mismatch
                    })
            });
            match parts {
                Ok((log_index, parts)) => {
                    for ((_, reply), outcomes) in writers.into_iter().zip(parts) {
                        let _ = reply.send(Ok(Committed {
                            log_index,
                            outcomes,
                        }));
                    }
                }
                Err(error) => {
                    for (_, reply) in writers {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
        });
    }
}

/// Proposes `command` to `log` and waits for its answer, holding `slot`
/// until the answer comes or this node stops leading the term it was
/// proposed in; after that, waits at most [`DEPOSED_ANSWER_WAIT_MS`] more.
async fn answer(
    log: &impl Log,
    command: Command,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Result<(u64, Vec<MutationResult>), BatchError> {
    // Taken before the proposal, so the term is the one it is made in.
    let deposed = log.deposed();
    let write = log.write(command);
    tokio::pin!(write);
    let result = tokio::select! {
        biased;
        result = &mut write => result,
        () = deposed => {
            drop(slot);
            let wait = Duration::from_millis(DEPOSED_ANSWER_WAIT_MS);
            match tokio::time::timeout(wait, write).await {
                Ok(result) => result,
                Err(_) => {
                    warn!(
                        wait_ms = DEPOSED_ANSWER_WAIT_MS,
                        "a batch proposed before this node stopped leading was never answered; \
                         its writers are told its outcome is unknown"
                    );
                    return Err(BatchError::Unanswered);
                }
            }
        }
    };
    result.map_err(|error| BatchError::Raft(Box::new(error)))
}

type Reply = oneshot::Sender<Result<Committed, BatchError>>;

/// The writes of one batch, within the limits. The first write is always
/// taken, whatever its size (the frame limit already bounds it).
struct Gather {
    mutations: Vec<Mutation>,
    bytes: usize,
    bytes_max: usize,
    writers: Vec<(usize, Reply)>,
}

impl Gather {
    fn new(first: Pending, bytes_max: usize) -> Gather {
        let mut gather = Gather {
            mutations: Vec::new(),
            bytes: 0,
            bytes_max,
            writers: Vec::new(),
        };
        gather.push(first);
        gather
    }

    /// Adds `next` if it fits; hands it back if it does not.
    fn add(&mut self, next: Pending) -> Result<(), Pending> {
        let mutations = self.mutations.len() + next.mutations.len();
        if mutations > BATCH_MUTATIONS_MAX || self.bytes + next.bytes > self.bytes_max {
            return Err(next);
        }
        self.push(next);
        Ok(())
    }

    fn push(&mut self, pending: Pending) {
        self.bytes += pending.bytes;
        self.writers.push((pending.mutations.len(), pending.reply));
        self.mutations.extend(pending.mutations);
    }

    fn finish(self) -> (Vec<Mutation>, Vec<(usize, Reply)>) {
        (self.mutations, self.writers)
    }
}

/// Cuts a batch's outcomes back into each writer's, by the number of
/// mutations each wrote. `None` when the counts do not add up.
pub fn split_outcomes(
    sizes: &[usize],
    outcomes: Vec<MutationResult>,
) -> Option<Vec<Vec<MutationResult>>> {
    if sizes.iter().sum::<usize>() != outcomes.len() {
        return None;
    }
    let mut rest = outcomes.into_iter();
    Some(
        sizes
            .iter()
            .map(|&n| rest.by_ref().take(n).collect())
            .collect(),
    )
}

/// The postcard size of `mutations`; a mutation that cannot be measured
/// counts as a full batch, so it travels alone.
fn encoded_bytes(mutations: &[Mutation]) -> usize {
    mutations
        .iter()
        .map(|m| postcard::experimental::serialized_size(m).unwrap_or(BATCH_BYTES_MAX))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::{ErrorCode, WireError};

    fn outcome(n: u64) -> MutationResult {
        Err(WireError::new(ErrorCode::NotFound, format!("{n}")))
    }

    #[test]
    fn outcomes_are_split_by_writer_in_order() {
        let outcomes: Vec<_> = (0..6).map(outcome).collect();
        let parts = split_outcomes(&[1, 3, 0, 2], outcomes).unwrap();
        assert_eq!(parts[0], vec![outcome(0)]);
        assert_eq!(parts[1], vec![outcome(1), outcome(2), outcome(3)]);
        assert!(parts[2].is_empty());
        assert_eq!(parts[3], vec![outcome(4), outcome(5)]);
    }

    #[test]
    fn outcome_counts_that_do_not_add_up_are_refused() {
        assert!(split_outcomes(&[2, 2], (0..3).map(outcome).collect()).is_none());
        assert!(split_outcomes(&[1], (0..2).map(outcome).collect()).is_none());
    }

    fn pending(mutations: usize, bytes: usize) -> Pending {
        let (reply, _) = oneshot::channel();
        Pending {
            mutations: (0..mutations)
                .map(|_| {
                    Mutation::Compact(storage::mutations::Compact {
                        created_before_ms: 0,
                        rows_max: 1,
                        requests_created_before_ms: 0,
                        keep_rows_min: 0,
                    })
                })
                .collect(),
            bytes,
            reply,
        }
    }

    #[test]
    fn batches_stop_at_the_mutation_and_byte_limits() {
        let mut gather = Gather::new(pending(BATCH_MUTATIONS_MAX - 1, 10), BATCH_BYTES_MAX);
        assert!(gather.add(pending(2, 10)).is_err(), "one mutation too many");
        assert!(gather.add(pending(1, 10)).is_ok());
        assert!(gather.add(pending(1, 1)).is_err(), "full");

        let mut gather = Gather::new(pending(1, BATCH_BYTES_MAX - 100), BATCH_BYTES_MAX);
        assert!(gather.add(pending(1, 101)).is_err(), "one byte too many");
        assert!(gather.add(pending(1, 100)).is_ok());
        let (mutations, writers) = gather.finish();
        assert_eq!((mutations.len(), writers.len()), (2, 2));
    }

    #[test]
    fn the_byte_limit_follows_a_small_frame_limit() {
        assert_eq!(batch_bytes_max(1 << 20), BATCH_BYTES_MAX);
        assert_eq!(batch_bytes_max(8192), 2048);
    }

    /// A stand-in for Raft: the first `hang` writes are never answered
    /// (as an entry that reached this node inside a snapshot); the others
    /// are answered at once. `term` is the term this node leads.
    #[derive(Clone)]
    struct StuckLog {
        hang: Arc<std::sync::atomic::AtomicUsize>,
        proposed: Arc<std::sync::atomic::AtomicUsize>,
        term: tokio::sync::watch::Sender<u64>,
    }

    impl StuckLog {
        fn new(hang: usize) -> StuckLog {
            StuckLog {
                hang: Arc::new(hang.into()),
                proposed: Arc::new(0.into()),
                term: tokio::sync::watch::Sender::new(1),
            }
        }
    }

    impl Log for StuckLog {
        async fn write(&self, command: Command) -> Result<(u64, Vec<MutationResult>), WriteError> {
            use std::sync::atomic::Ordering::SeqCst;
            let index = self.proposed.fetch_add(1, SeqCst) as u64 + 1;
            if self
                .hang
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                std::future::pending::<()>().await;
            }
            Ok((
                index,
                command.mutations.iter().map(|_| outcome(index)).collect(),
            ))
        }

        fn deposed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
            let mut term = self.term.subscribe();
            Box::pin(async move {
                let _ = term.changed().await;
            })
        }
    }

    struct FixedClock;

    impl wire::clock::Clock for FixedClock {
        fn now_ms(&self) -> u64 {
            1
        }
    }

    impl Clock for FixedClock {
        fn random_u64(&self) -> u64 {
            4
        }
    }

    #[tokio::test(start_paused = true)]
    async fn batches_never_answered_hold_their_slots_only_while_this_node_leads() {
        use std::sync::atomic::Ordering::SeqCst;
        let log = StuckLog::new(BATCHES_IN_FLIGHT_MAX);
        let batcher = Batcher::start(log.clone(), Arc::new(FixedClock), BATCH_BYTES_MAX);
        let write = |batcher: &Batcher| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.write(pending(1, 1).mutations).await })
        };
        // One write per batch: each is proposed before the next is sent.
        let mut stuck = Vec::new();
        for proposed in 1..=BATCHES_IN_FLIGHT_MAX {
            stuck.push(write(&batcher));
            while log.proposed.load(SeqCst) < proposed {
                tokio::task::yield_now().await;
            }
        }

        // Every slot is held: a further write waits (however long) while
        // this node still leads the term the stuck batches were made in.
        let mut next = write(&batcher);
        let waited = tokio::time::timeout(Duration::from_secs(600), &mut next).await;
        assert!(waited.is_err(), "a write went through with every slot held");
        assert_eq!(log.proposed.load(SeqCst), BATCHES_IN_FLIGHT_MAX);

        // A new term (this node deposed, or leading again later): the
        // slots are freed and the waiting write is proposed and answered.
        log.term.send_modify(|term| *term += 1);
        let committed = tokio::time::timeout(Duration::from_secs(60), next)
            .await
            .expect("the waiting write is proposed once the slots are freed")
            .unwrap()
            .expect("answered once the slots are freed");
        assert_eq!(committed.log_index, BATCHES_IN_FLIGHT_MAX as u64 + 1);

        // The stuck batches' writers are told, in time, that their outcome
        // is unknown.
        for stuck in stuck {
            let answer =
                tokio::time::timeout(Duration::from_millis(DEPOSED_ANSWER_WAIT_MS + 1_000), stuck)
                    .await
                    .expect("a stuck batch is let go")
                    .unwrap();
            assert!(matches!(answer, Err(BatchError::Unanswered)), "{answer:?}");
        }
    }

    #[test]
    fn an_oversized_first_write_still_travels_alone() {
        let gather = Gather::new(
            pending(BATCH_MUTATIONS_MAX + 5, BATCH_BYTES_MAX * 2),
            BATCH_BYTES_MAX,
        );
        let (mutations, writers) = gather.finish();
        assert_eq!(mutations.len(), BATCH_MUTATIONS_MAX + 5);
        assert_eq!(writers.len(), 1);
    }
}
