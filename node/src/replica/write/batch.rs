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
//! Which writes go together and how outcomes are split back are plain
//! functions (`Gather`, [`split_outcomes`]), tested without Raft.

use std::sync::Arc;

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

/// What Raft said about a batch, as each of its writers receives it.
pub type WriteError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// Why a write got no outcome from the batcher.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// Raft did not commit the batch.
    #[error(transparent)]
    Raft(Box<WriteError>),
    /// The batcher stopped (the node is shutting down).
    #[error("the node is shutting down")]
    Closed,
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
    /// Starts the batching task for `raft`, stamping batches with `clock`;
    /// batches hold at most `bytes_max` encoded bytes of mutations.
    pub fn start(raft: Raft, clock: Arc<dyn Clock>, bytes_max: usize) -> Batcher {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(raft, clock, bytes_max, receiver));
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
    raft: Raft,
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
        let raft = raft.clone();
        let now_ms = clock.now_ms();
        tokio::spawn(async move {
            let (mutations, writers) = batch;
            let sizes: Vec<usize> = writers.iter().map(|(n, _)| *n).collect();
            let result = raft.client_write(Command { now_ms, mutations }).await;
            drop(slot);
            let parts = match result {
                Ok(response) => split_outcomes(&sizes, response.data.outcomes)
                    .map(|parts| (response.log_id.index, parts))
                    .ok_or_else(|| {
                        warn!("a batch's outcomes do not match its mutations");
                        BatchError::Mismatch
                    }),
                Err(error) => Err(BatchError::Raft(Box::new(error))),
            };
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
                .map(|_| Mutation::Compact {
                    created_before_ms: 0,
                    rows_max: 1,
                    requests_created_before_ms: 0,
                    keep_rows_min: 0,
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
