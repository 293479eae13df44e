//! Notification endpoints and deliveries as operators manage them: add
//! (validated here for a quick answer, and again in apply), remove (its
//! pending deliveries become dead), list (secrets shown as set or not,
//! never sent), the deliveries page by page, and replay.

use storage::{Mutation, mutations};
use wire::notify::{AddEndpoint, Delivery, EndpointView, NotifyEndpoint};
use wire::operator::{DeliveryPage, LIST_PAGE_MAX};
use wire::{ErrorCode, WireError};

use super::{Propose, ReadState, internal, propose, recorded};

/// Adds an endpoint; returns it as operators see it.
pub async fn add<S: Propose + ReadState>(
    state: &S,
    request: AddEndpoint,
) -> Result<EndpointView, WireError> {
    request.validate()?;
    let name = request.name.clone();
    recorded(
        state,
        Mutation::AddNotifyEndpoint(NotifyEndpoint {
            name: request.name,
            url: request.url,
            secret: request.secret,
            // Stamped by apply.
            created_at_ms: 0,
        }),
    )
    .await?;
    let view = state.read().map_err(internal)?;
    let stored = view.notify_endpoints().map_err(internal)?;
    stored
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.view())
        .ok_or_else(|| super::not_found("endpoint", &name))
}

/// Removes an endpoint; how many of its pending deliveries became dead.
pub async fn remove(state: &impl Propose, name: String) -> Result<u64, WireError> {
    propose(state, mutations::RemoveNotifyEndpoint { name }).await
}

/// Every endpoint, by name, without secrets.
pub fn list(state: &impl ReadState) -> Result<Vec<EndpointView>, WireError> {
    let view = state.read().map_err(internal)?;
    Ok(view
        .notify_endpoints()
        .map_err(internal)?
        .iter()
        .map(NotifyEndpoint::view)
        .collect())
}

/// Deliveries with ids after `after`, at most `limit` (1 to
/// [`LIST_PAGE_MAX`]), and the dropped count.
pub fn deliveries(
    state: &impl ReadState,
    after: u64,
    limit: u32,
) -> Result<DeliveryPage, WireError> {
    if limit == 0 || limit > LIST_PAGE_MAX {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {LIST_PAGE_MAX}"),
        ));
    }
    let view = state.read().map_err(internal)?;
    let page = usize::try_from(limit).unwrap_or(usize::MAX);
    let items = view.deliveries(after, page).map_err(internal)?;
    let next_after = (items.len() == page)
        .then(|| items.last().map(|d| d.id))
        .flatten();
    Ok(DeliveryPage {
        items,
        next_after,
        dropped: view.notify_dropped(),
    })
}

/// Makes a dead or delivered delivery pending again; returns it.
pub async fn replay<S: Propose + ReadState>(state: &S, id: u64) -> Result<Delivery, WireError> {
    propose(state, mutations::ReplayDelivery { delivery_id: id }).await?;
    let view = state.read().map_err(internal)?;
    view.delivery(id)
        .map_err(internal)?
        .ok_or_else(|| super::not_found("delivery", &id.to_string()))
}

#[cfg(test)]
mod tests {
    use wire::notify::DeliveryState;

    use super::*;
    use crate::app::deployments::testing::failed_deploy;
    use crate::app::testing::MemoryNode;

    fn endpoint(name: &str, secret: Option<&str>) -> AddEndpoint {
        AddEndpoint {
            name: name.into(),
            url: format!("https://hooks.example/{name}"),
            secret: secret.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn endpoints_are_added_listed_without_secrets_and_removed() {
        let node = MemoryNode::new();
        let view = add(&node, endpoint("chat", Some("s3cret"))).await.unwrap();
        assert!(view.secret_set);
        add(&node, endpoint("pager", None)).await.unwrap();
        let listed = list(&node).unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|e| (e.name.as_str(), e.secret_set))
                .collect::<Vec<_>>(),
            [("chat", true), ("pager", false)]
        );
        let e = add(&node, endpoint("chat", None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict);
        let mut bad = endpoint("bad", None);
        bad.url = "gopher://x".into();
        assert_eq!(
            add(&node, bad).await.unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert_eq!(remove(&node, "chat".into()).await.unwrap(), 0);
        assert_eq!(list(&node).unwrap().len(), 1);
        let e = remove(&node, "chat".into()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
    }

    #[tokio::test]
    async fn deliveries_page_and_replay() {
        let node = MemoryNode::new();
        add(&node, endpoint("chat", None)).await.unwrap();
        for _ in 0..3 {
            failed_deploy(&node).await;
        }
        let first = deliveries(&node, 0, 2).unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.next_after, Some(2));
        let rest = deliveries(&node, 2, 2).unwrap();
        assert_eq!(rest.items.len(), 1);
        assert_eq!(rest.next_after, None);
        assert_eq!(
            deliveries(&node, 0, 0).unwrap_err().code,
            ErrorCode::BadRequest
        );
        let e = replay(&node, 1).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition, "pending already");
        remove(&node, "chat".into()).await.unwrap();
        let page = deliveries(&node, 0, 10).unwrap();
        assert!(page.items.iter().all(|d| d.state == DeliveryState::Dead));
        // Only a delivery whose endpoint exists may be replayed.
        let e = replay(&node, 1).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
    }
}
