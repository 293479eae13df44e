//! The watch protocol's rules, with no I/O: which events may follow which,
//! how the cursor moves, and what the server answers to a cursor.
//!
//! [`plan_watch`] is the server's decision for a new watch. [`WatchServer`]
//! guards what the server emits; [`WatchClient`] checks what the agent
//! receives and holds the cursor, which advances only when the agent says an
//! event was applied. The async drivers in `node` and `agent` feed these
//! from sockets; the tests here wire them together in memory.

use crate::agent::{ResourceChange, WatchEvent};
use crate::error::{ErrorCode, WireError};
use crate::model::{Pk, Resource};

/// What the server does with a watch request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Cursor 0: stream every live resource from one snapshot.
    FullSync,
    /// Stream the region's change rows with pk > `after`.
    Incremental {
        /// The client's cursor: stream rows after it.
        after: Pk,
    },
    /// The rows after the cursor were compacted away.
    ResyncRequired {
        /// The compaction floor, above the cursor.
        floor: Pk,
    },
    /// The cursor is ahead of what this node has applied (a lagging
    /// follower): wait, bounded, for the node to catch up.
    WaitForCatchUp {
        /// The client's cursor, above this node's applied pk.
        cursor: Pk,
    },
    /// The cursor was taken in another cluster epoch: tell the agent to
    /// sync in full.
    EpochChanged {
        /// The node's epoch.
        epoch: u64,
    },
}

/// Decides how to serve `cursor`, taken in cluster epoch `epoch`, given
/// the node's epoch `node_epoch`, the compaction `floor` (every change row
/// with pk <= floor may be gone) and the node's `applied_pk`. A cursor of
/// another epoch means nothing here (the cluster was restored): the agent
/// must sync in full, whether its cursor is behind or ahead. Epoch 0 is a
/// client that does not know (a debugging watch): its cursor is trusted.
pub fn plan_watch(
    cursor: Pk,
    epoch: u64,
    node_epoch: u64,
    floor: Pk,
    applied_pk: Pk,
) -> WatchStart {
    if cursor == 0 {
        WatchStart::FullSync
    } else if epoch != 0 && epoch != node_epoch {
        WatchStart::EpochChanged { epoch: node_epoch }
    } else if cursor < floor {
        WatchStart::ResyncRequired { floor }
    } else if cursor > applied_pk {
        WatchStart::WaitForCatchUp { cursor }
    } else {
        WatchStart::Incremental { after: cursor }
    }
}

/// Where a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing sent (server) or received (client) yet.
    Opened,
    /// Inside a full sync read at `cursor`.
    Syncing { cursor: Pk },
    /// Streaming changes; `last` is the last pk sent or received.
    Live { last: Pk },
    /// A final event (resync-required, error) went out or came in.
    Closed,
}

/// A broken rule of the watch protocol: which rule, and the positions
/// that broke it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("watch protocol violation: {}", self.detail())]
#[non_exhaustive]
pub enum SessionError {
    /// An event where the protocol has no place for it (`when`: "as the
    /// first event of this stream", "during a full sync", ...).
    OutOfPlace {
        /// The event's name (`sync-start`, `change`, ...).
        event: &'static str,
        /// Where it came.
        when: &'static str,
    },
    /// A full sync's item newer than the sync's cursor.
    ItemAfterCursor {
        /// The item's version.
        version: Pk,
        /// The sync's cursor.
        cursor: Pk,
    },
    /// A sync-end whose cursor is not its sync-start's.
    SyncEndMoved {
        /// The sync-start's cursor.
        start: Pk,
        /// The sync-end's cursor.
        end: Pk,
    },
    /// A change not after the last pk of the stream.
    ChangeNotAfter {
        /// The change's version.
        version: Pk,
        /// The last pk sent or received.
        last: Pk,
    },
    /// A bookmark before the last pk of the stream.
    ProgressBack {
        /// The bookmark's cursor.
        cursor: Pk,
        /// The last pk received.
        last: Pk,
    },
    /// An event received while the one before it was not yet confirmed
    /// applied.
    Unconfirmed {
        /// The version waiting for its confirmation.
        pending: Pk,
    },
    /// A confirmation of another version than the one handed out.
    WrongConfirmation {
        /// The version confirmed.
        version: Pk,
        /// The version handed out, if any.
        pending: Option<Pk>,
    },
}

impl SessionError {
    /// What was wrong, without the "watch protocol violation" prefix.
    pub fn detail(&self) -> String {
        match self {
            SessionError::OutOfPlace { event, when } => format!("{event} not allowed {when}"),
            SessionError::ItemAfterCursor { version, cursor } => {
                format!("sync item version {version} is after the sync cursor {cursor}")
            }
            SessionError::SyncEndMoved { start, end } => {
                format!("sync-end cursor {end} differs from sync-start cursor {start}")
            }
            SessionError::ChangeNotAfter { version, last } => {
                format!("change {version} is not after the last pk {last}")
            }
            SessionError::ProgressBack { cursor, last } => {
                format!("progress {cursor} goes back before pk {last}")
            }
            SessionError::Unconfirmed { pending } => {
                format!("event received before version {pending} was confirmed applied")
            }
            SessionError::WrongConfirmation { version, pending } => {
                format!("applied({version}) does not match the pending event {pending:?}")
            }
        }
    }
}

impl From<SessionError> for WireError {
    fn from(err: SessionError) -> Self {
        WireError::new(ErrorCode::ProtocolViolation, err.detail())
    }
}

/// "as the first event of this stream", "during a full sync", ...: where
/// an event came, for [`SessionError::OutOfPlace`].
fn when(phase: Phase) -> &'static str {
    match phase {
        Phase::Opened => "as the first event of this stream",
        Phase::Syncing { .. } => "during a full sync",
        Phase::Live { .. } => "after the sync",
        Phase::Closed => "after the stream closed",
    }
}

/// The server side of one watch stream: builds the events and refuses to
/// emit anything out of order.
#[derive(Debug)]
pub struct WatchServer {
    phase: Phase,
}

impl WatchServer {
    /// A session before its first event.
    pub fn new() -> Self {
        WatchServer {
            phase: Phase::Opened,
        }
    }

    /// The last pk the client has been told about (0 before any).
    pub fn cursor(&self) -> Pk {
        match self.phase {
            Phase::Live { last } => last,
            _ => 0,
        }
    }

    /// Begins a full sync from the snapshot at `cursor`; only as the first event.
    pub fn sync_start(&mut self, cursor: Pk, epoch: u64) -> Result<WatchEvent, SessionError> {
        if self.phase != Phase::Opened {
            return Err(SessionError::OutOfPlace {
                event: "sync-start",
                when: when(self.phase),
            });
        }
        self.phase = Phase::Syncing { cursor };
        Ok(WatchEvent::SyncStart { cursor, epoch })
    }

    /// The request's epoch is not the node's; only as the first event, and
    /// it ends the stream.
    pub fn epoch_changed(&mut self, epoch: u64) -> Result<WatchEvent, SessionError> {
        if self.phase != Phase::Opened {
            return Err(SessionError::OutOfPlace {
                event: "epoch-changed",
                when: when(self.phase),
            });
        }
        self.phase = Phase::Closed;
        Ok(WatchEvent::EpochChanged { epoch })
    }

    /// One resource of the full sync; refused if newer than the snapshot.
    pub fn sync_item(&mut self, resource: Resource) -> Result<WatchEvent, SessionError> {
        match self.phase {
            Phase::Syncing { cursor } if resource.version() <= cursor => {
                Ok(WatchEvent::SyncItem(resource))
            }
            Phase::Syncing { cursor } => Err(SessionError::ItemAfterCursor {
                version: resource.version(),
                cursor,
            }),
            phase => Err(SessionError::OutOfPlace {
                event: "sync-item",
                when: when(phase),
            }),
        }
    }

    /// Ends the full sync; the client's cursor becomes the snapshot's.
    pub fn sync_end(&mut self) -> Result<WatchEvent, SessionError> {
        match self.phase {
            Phase::Syncing { cursor } => {
                self.phase = Phase::Live { last: cursor };
                Ok(WatchEvent::SyncEnd { cursor })
            }
            phase => Err(SessionError::OutOfPlace {
                event: "sync-end",
                when: when(phase),
            }),
        }
    }

    /// Starts an incremental stream after `cursor`.
    pub fn resume(&mut self, cursor: Pk) -> Result<(), SessionError> {
        if self.phase != Phase::Opened {
            return Err(SessionError::OutOfPlace {
                event: "resume",
                when: when(self.phase),
            });
        }
        self.phase = Phase::Live { last: cursor };
        Ok(())
    }

    /// A change row newer than the last one sent; an older one is refused.
    pub fn change(
        &mut self,
        version: Pk,
        change: ResourceChange,
    ) -> Result<WatchEvent, SessionError> {
        match self.phase {
            Phase::Live { last } if version > last => {
                self.phase = Phase::Live { last: version };
                Ok(WatchEvent::Change { version, change })
            }
            Phase::Live { last } => Err(SessionError::ChangeNotAfter { version, last }),
            phase => Err(SessionError::OutOfPlace {
                event: "change",
                when: when(phase),
            }),
        }
    }

    /// A bookmark, if `pk` is news to the client.
    pub fn progress(&mut self, pk: Pk) -> Option<WatchEvent> {
        match self.phase {
            Phase::Live { last } if pk > last => {
                self.phase = Phase::Live { last: pk };
                Some(WatchEvent::Progress { cursor: pk })
            }
            _ => None,
        }
    }

    /// Ends the stream: the cursor is below the compaction `floor`.
    pub fn resync_required(&mut self, floor: Pk) -> WatchEvent {
        self.phase = Phase::Closed;
        WatchEvent::ResyncRequired { floor }
    }

    /// Ends the stream with `error`.
    pub fn error(&mut self, error: WireError) -> WatchEvent {
        self.phase = Phase::Closed;
        WatchEvent::Error(error)
    }
}

impl Default for WatchServer {
    fn default() -> Self {
        Self::new()
    }
}

/// What the agent must do with a received event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAction {
    /// A full sync begins: start collecting the desired set.
    BeginFullSync {
        /// The snapshot's last change pk.
        cursor: Pk,
        /// The snapshot's cluster epoch, to store with the sync's cursor.
        epoch: u64,
    },
    /// Apply this resource as part of the full sync.
    ApplySynced(Resource),
    /// The full sync ended: garbage-collect what was not mentioned, then
    /// call [`WatchClient::applied`] with `cursor`.
    FinishFullSync {
        /// The cursor to store once garbage collection is done.
        cursor: Pk,
    },
    /// Apply (or delete) one resource, then call [`WatchClient::applied`]
    /// with `version`.
    Apply {
        /// The change row's pk.
        version: Pk,
        /// The resource's state, or its deletion.
        change: ResourceChange,
    },
    /// Nothing to apply up to `cursor`; the cursor already moved.
    Progress {
        /// The cursor now stored.
        cursor: Pk,
    },
    /// The cursor is compacted away: reset to 0 and reconnect.
    Resync {
        /// The compaction floor the cursor fell below.
        floor: Pk,
    },
    /// The server ended the stream with an error.
    Failed(WireError),
    /// The cluster's epoch is not the one the cursor was taken in (it was
    /// restored): reset to 0 and reconnect, for a full sync.
    EpochChanged {
        /// The cluster's epoch now.
        epoch: u64,
    },
}

/// The agent side of one watch stream.
#[derive(Debug)]
pub struct WatchClient {
    requested: Pk,
    /// The last pk the agent applied everything up to: what it stores.
    cursor: Pk,
    /// Version of an event handed out and not yet confirmed applied.
    pending: Option<Pk>,
    phase: Phase,
}

impl WatchClient {
    /// A stream requested with `cursor`.
    pub fn new(cursor: Pk) -> Self {
        WatchClient {
            requested: cursor,
            cursor,
            pending: None,
            phase: Phase::Opened,
        }
    }

    /// The cursor to store and to reconnect with.
    pub fn cursor(&self) -> Pk {
        self.cursor
    }

    /// Checks one received event and says what to do with it.
    pub fn on_event(&mut self, event: WatchEvent) -> Result<ClientAction, SessionError> {
        if let Some(version) = self.pending {
            return Err(SessionError::Unconfirmed { pending: version });
        }
        match (self.phase, event) {
            (Phase::Opened, WatchEvent::SyncStart { cursor, epoch }) if self.requested == 0 => {
                self.phase = Phase::Syncing { cursor };
                Ok(ClientAction::BeginFullSync { cursor, epoch })
            }
            (Phase::Opened, WatchEvent::EpochChanged { epoch }) if self.requested > 0 => {
                self.phase = Phase::Closed;
                self.cursor = 0;
                Ok(ClientAction::EpochChanged { epoch })
            }
            (Phase::Syncing { cursor }, WatchEvent::SyncItem(resource)) => {
                if resource.version() > cursor {
                    return Err(SessionError::ItemAfterCursor {
                        version: resource.version(),
                        cursor,
                    });
                }
                Ok(ClientAction::ApplySynced(resource))
            }
            (Phase::Syncing { cursor }, WatchEvent::SyncEnd { cursor: end }) => {
                if end != cursor {
                    return Err(SessionError::SyncEndMoved { start: cursor, end });
                }
                self.phase = Phase::Live { last: cursor };
                self.pending = Some(cursor);
                Ok(ClientAction::FinishFullSync { cursor })
            }
            (Phase::Opened, WatchEvent::Change { version, change }) if self.requested > 0 => {
                self.live_change(self.requested, version, change)
            }
            (Phase::Live { last }, WatchEvent::Change { version, change }) => {
                self.live_change(last, version, change)
            }
            (Phase::Opened, WatchEvent::Progress { cursor }) if self.requested > 0 => {
                self.live_progress(self.requested, cursor)
            }
            (Phase::Live { last }, WatchEvent::Progress { cursor }) => {
                self.live_progress(last, cursor)
            }
            (Phase::Opened | Phase::Live { .. }, WatchEvent::ResyncRequired { floor }) => {
                self.phase = Phase::Closed;
                self.cursor = 0;
                Ok(ClientAction::Resync { floor })
            }
            (Phase::Closed, event) => Err(SessionError::OutOfPlace {
                event: event_name(&event),
                when: when(Phase::Closed),
            }),
            (_, WatchEvent::Error(error)) => {
                self.phase = Phase::Closed;
                Ok(ClientAction::Failed(error))
            }
            (phase, event) => Err(SessionError::OutOfPlace {
                event: event_name(&event),
                when: when(phase),
            }),
        }
    }

    /// Confirms that the event handed out with `version` was applied; the
    /// cursor moves to it.
    pub fn applied(&mut self, version: Pk) -> Result<(), SessionError> {
        match self.pending.take() {
            Some(pending) if pending == version => {
                self.cursor = version;
                Ok(())
            }
            pending => Err(SessionError::WrongConfirmation { version, pending }),
        }
    }

    fn live_change(
        &mut self,
        last: Pk,
        version: Pk,
        change: ResourceChange,
    ) -> Result<ClientAction, SessionError> {
        if version <= last {
            return Err(SessionError::ChangeNotAfter { version, last });
        }
        self.phase = Phase::Live { last: version };
        self.pending = Some(version);
        Ok(ClientAction::Apply { version, change })
    }

    fn live_progress(&mut self, last: Pk, cursor: Pk) -> Result<ClientAction, SessionError> {
        if cursor < last {
            return Err(SessionError::ProgressBack { cursor, last });
        }
        self.phase = Phase::Live { last: cursor };
        self.cursor = cursor;
        Ok(ClientAction::Progress { cursor })
    }
}

fn event_name(event: &WatchEvent) -> &'static str {
    match event {
        WatchEvent::SyncStart { .. } => "sync-start",
        WatchEvent::EpochChanged { .. } => "epoch-changed",
        WatchEvent::SyncItem(_) => "sync-item",
        WatchEvent::SyncEnd { .. } => "sync-end",
        WatchEvent::Change { .. } => "change",
        WatchEvent::Progress { .. } => "progress",
        WatchEvent::ResyncRequired { .. } => "resync-required",
        WatchEvent::Error(_) => "error",
    }
}

#[cfg(test)]
mod tests;
