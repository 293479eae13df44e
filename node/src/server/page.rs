//! Replies bounded by bytes: a list reply is cut to fit one frame, however
//! large its items, and its cursor set to the last item kept, so the
//! client reads on from there. The item-count limits of the requests
//! (`LIST_PAGE_MAX`) still apply; this is the byte bound under them.
//!
//! A page always holds at least one item, so paging makes progress (an
//! item was accepted in a request frame of the same limit).

use serde::Serialize;
use wire::operator::OperatorResponse;

/// Bytes of a reply kept for everything but its items: the response's
/// variant, the cursor (ids and region names, each at most a few hundred
/// bytes), counters, and the frame's own length prefix.
pub const REPLY_ENVELOPE_BYTES: usize = 2 * 1024;

/// The byte budget of a reply's items under a frame limit: the smaller of
/// the node's limit and the client's (`wire::frame::FRAME_BYTES_MAX`, what
/// the operator client reads), less [`REPLY_ENVELOPE_BYTES`].
pub fn items_bytes_max(frame_bytes_max: usize) -> usize {
    frame_bytes_max
        .min(wire::frame::FRAME_BYTES_MAX)
        .saturating_sub(REPLY_ENVELOPE_BYTES)
}

/// Encoded size of `item` (postcard); an item that does not encode counts
/// as unbounded, so it ends the page (the reply's own encoding then
/// reports the error).
fn encoded_bytes<T: Serialize>(item: &T) -> usize {
    postcard::to_allocvec(item).map_or(usize::MAX, |bytes| bytes.len())
}

/// Keeps the longest prefix of `items` whose encoding fits `bytes_max`
/// (at least one item). Returns whether items were cut.
pub fn fit<T: Serialize>(items: &mut Vec<T>, bytes_max: usize) -> bool {
    // The sequence's length prefix: a varint of at most 10 bytes.
    let mut total: usize = 10;
    let mut kept = 0;
    for item in items.iter() {
        total = total.saturating_add(encoded_bytes(item));
        if total > bytes_max && kept > 0 {
            break;
        }
        kept += 1;
    }
    let cut = kept < items.len();
    items.truncate(kept);
    cut
}

/// `response`, its items cut to `bytes_max` where it is a list, with the
/// cursor moved to the last item kept. Other replies pass unchanged.
pub fn bounded(response: OperatorResponse, bytes_max: usize) -> OperatorResponse {
    match response {
        OperatorResponse::Deployments {
            mut items,
            next_after,
        } => {
            let next_after = if fit(&mut items, bytes_max) {
                items.last().map(|d| d.id.clone())
            } else {
                next_after
            };
            OperatorResponse::Deployments { items, next_after }
        }
        OperatorResponse::History {
            mut entries,
            next_after,
        } => {
            let next_after = if fit(&mut entries, bytes_max) {
                entries.last().map(|e| e.seq)
            } else {
                next_after
            };
            OperatorResponse::History {
                entries,
                next_after,
            }
        }
        OperatorResponse::Sentinels {
            mut items,
            next_after,
        } => {
            let next_after = if fit(&mut items, bytes_max) {
                items
                    .last()
                    .map(|s| (s.sentinel.region.clone(), s.sentinel.id.clone()))
            } else {
                next_after
            };
            OperatorResponse::Sentinels { items, next_after }
        }
        OperatorResponse::Deliveries(mut page) => {
            if fit(&mut page.items, bytes_max) {
                page.next_after = page.items.last().map(|d| d.id);
            }
            OperatorResponse::Deliveries(page)
        }
        // No cursor in the reply: the client reads on after its last item
        // until a page comes back empty.
        OperatorResponse::Policies(mut items) => {
            fit(&mut items, bytes_max);
            OperatorResponse::Policies(items)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::deployments;
    use crate::app::testing::{MemoryNode, create_request};
    use std::collections::BTreeSet;
    use wire::operator::LIST_PAGE_MAX;

    /// A frame limit at which a page of deployments holds a few dozen.
    const SMALL_FRAME_BYTES: usize = 16 * 1024;

    fn reply_bytes(response: &OperatorResponse) -> usize {
        postcard::to_allocvec(response).expect("encodes").len()
    }

    #[tokio::test]
    async fn a_page_never_exceeds_the_frame_and_paging_reads_every_item_once() {
        let node = MemoryNode::new();
        let settings = config::DeploySettings::default();
        let mut created = BTreeSet::new();
        for i in 0..300 {
            let mut request = create_request(&["us-east"]);
            // Sizes vary, so pages end at different counts.
            request.image = format!("registry.example/app{}:{}", "x".repeat(i % 97), i);
            let id = deployments::create(&node, node.clock(), &settings, request)
                .await
                .expect("create");
            created.insert(id);
        }
        let bytes_max = items_bytes_max(SMALL_FRAME_BYTES);
        let mut seen = BTreeSet::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let (items, next_after) =
                deployments::list(&node, after.as_deref(), LIST_PAGE_MAX).expect("list");
            let response = bounded(
                OperatorResponse::Deployments { items, next_after },
                bytes_max,
            );
            assert!(reply_bytes(&response) <= SMALL_FRAME_BYTES, "page {pages}");
            let OperatorResponse::Deployments { items, next_after } = response else {
                panic!("a deployments page");
            };
            assert!(!items.is_empty(), "a page makes progress");
            for item in items {
                assert!(seen.insert(item.id.clone()), "{} twice", item.id);
            }
            pages += 1;
            match next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, created);
        assert!(pages > 3, "the frame cut the pages ({pages})");
    }

    #[test]
    fn a_page_keeps_at_least_one_item_and_cuts_at_the_limit() {
        let mut items = vec!["a".repeat(100), "b".repeat(100), "c".repeat(100)];
        assert!(fit(&mut items, 10));
        assert_eq!(items.len(), 1, "one item, even over the limit");
        let mut items = vec!["a".repeat(100), "b".repeat(100), "c".repeat(100)];
        // 10 for the length prefix, 101 per item.
        assert!(fit(&mut items, 10 + 2 * 101));
        assert_eq!(items.len(), 2);
        let mut items = vec!["a".repeat(100)];
        assert!(!fit(&mut items, 1 << 20));
        assert_eq!(items.len(), 1);
    }

    #[test]
    fn the_budget_is_under_both_frame_limits() {
        assert_eq!(
            items_bytes_max(64 << 20),
            wire::frame::FRAME_BYTES_MAX - REPLY_ENVELOPE_BYTES
        );
        assert_eq!(items_bytes_max(16 << 10), (16 << 10) - REPLY_ENVELOPE_BYTES);
    }
}
