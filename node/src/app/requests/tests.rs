//! Tests of `node/src/app/requests`.

use storage::mutations;
use wire::model::DesiredState;
use wire::operator::ApplyPolicy;

use super::*;
use crate::app::testing::{MemoryNode, create_request};

const ACTOR: &str = "ctrl://operator";

fn id(text: &str) -> RequestId {
    RequestId::parse(text).unwrap()
}

async fn once(
    node: &MemoryNode,
    request_id: &str,
    request: OperatorRequest,
) -> Result<OperatorResponse, WireError> {
    apply_once(
        node,
        node.clock(),
        &settings(),
        &id(request_id),
        ACTOR,
        request,
    )
    .await
}

fn settings() -> DeploySettings {
    DeploySettings::default()
}

fn create() -> OperatorRequest {
    OperatorRequest::CreateDeployment(create_request(&["us-east"]))
}

fn hash(node: &MemoryNode) -> u64 {
    node.read().unwrap().state_hash().unwrap()
}

fn deployments(node: &MemoryNode) -> usize {
    node.read()
        .unwrap()
        .list_deployments(None, 100)
        .unwrap()
        .len()
}

#[test]
fn the_fingerprint_is_the_sha256_of_the_request_alone() {
    let a = fingerprint(None, &create()).unwrap();
    assert_eq!(a, fingerprint(None, &create()).unwrap(), "stable");
    let mut other = create_request(&["us-east"]);
    other.replicas = 2;
    assert_ne!(
        a,
        fingerprint(None, &OperatorRequest::CreateDeployment(other)).unwrap()
    );
    // SHA-256 of the postcard bytes, as ring computes it.
    let bytes = postcard::to_allocvec(&create()).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    assert_eq!(&a[..], digest.as_ref());
}

#[tokio::test]
async fn a_create_repeated_with_its_id_answers_the_first_deployment() {
    let node = MemoryNode::new();
    let first = once(&node, "r1", create()).await.unwrap();
    let OperatorResponse::Created { deployment_id } = &first else {
        panic!("{first:?}");
    };
    let before = hash(&node);
    // The retry mints another deployment id; the record answers.
    let again = once(&node, "r1", create()).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(hash(&node), before, "nothing written");
    assert_eq!(deployments(&node), 1);
    let record = node.read().unwrap().request("r1").unwrap().unwrap();
    assert_eq!(record.actor, ACTOR);
    assert_eq!(
        record.result,
        Ok(Outcome::DeploymentCreated {
            deployment_id: deployment_id.clone()
        })
    );
    // Another id is another request.
    once(&node, "r2", create()).await.unwrap();
    assert_eq!(deployments(&node), 2);
}

/// A sentinel apply retried under its id after another apply changed the
/// sentinel answers the version its first apply made, and proposes a
/// mutation that writes nothing.
#[tokio::test]
async fn a_retried_sentinel_apply_answers_what_its_first_apply_made() {
    let node = MemoryNode::new();
    let apply = |image: Option<&str>, replicas: Option<u32>| {
        OperatorRequest::ApplySentinel(ApplySentinel {
            workspace_id: "ws_1".into(),
            project_id: "proj_1".into(),
            app_id: "app_1".into(),
            environment_id: "env_1".into(),
            region: "us-east".into(),
            image: image.map(Into::into),
            replicas,
            cpu_millicores: None,
            memory_mib: None,
            deadline_ms: None,
        })
    };
    let first = once(&node, "s1", apply(Some("sentinel:1"), Some(2)))
        .await
        .unwrap();
    let OperatorResponse::SentinelDeployed { version, .. } = &first else {
        panic!("{first:?}");
    };
    let later = once(&node, "s2", apply(None, Some(4))).await.unwrap();
    assert_ne!(later, first);
    let before = hash(&node);
    let again = once(&node, "s1", apply(Some("sentinel:1"), Some(2)))
        .await
        .unwrap();
    assert_eq!(again, first, "the first answer, version {version}");
    assert_eq!(hash(&node), before, "nothing written");
}

#[tokio::test]
async fn the_same_id_for_another_request_is_a_conflict() {
    let node = MemoryNode::new();
    let OperatorResponse::Created { deployment_id } = once(&node, "r1", create()).await.unwrap()
    else {
        panic!("created");
    };
    let before = hash(&node);
    let stop = OperatorRequest::SetDesiredState(SetDesiredState {
        id: deployment_id,
        desired_state: DesiredState::Standby,
        after_ms: None,
        force: true,
    });
    let e = once(&node, "r1", stop).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(
        e.message.contains("r1") && e.message.contains(ACTOR),
        "{}",
        e.message
    );
    assert_eq!(hash(&node), before);
}

#[tokio::test]
async fn a_retried_delete_answers_as_the_first_though_the_policy_is_gone() {
    let node = MemoryNode::new();
    let apply = OperatorRequest::ApplyPolicy(ApplyPolicy {
        workspace_id: "ws".into(),
        environment_id: "env".into(),
        region: "us-east".into(),
        name: "web".into(),
        namespace: "apps".into(),
        policy_json: r#"{"endpointSelector":{}}"#.into(),
    });
    let OperatorResponse::PolicyApplied { policy_id } =
        once(&node, "a1", apply.clone()).await.unwrap()
    else {
        panic!("applied");
    };
    assert_eq!(
        once(&node, "a1", apply).await.unwrap(),
        OperatorResponse::PolicyApplied {
            policy_id: policy_id.clone()
        }
    );
    let delete = OperatorRequest::DeletePolicy(DeletePolicy {
        id: policy_id.clone(),
    });
    let first = once(&node, "d1", delete.clone()).await.unwrap();
    let proposals = node.proposals();
    // The policy is gone, so the rule refuses before proposing; the
    // record of the id answers instead.
    assert_eq!(once(&node, "d1", delete.clone()).await.unwrap(), first);
    assert_eq!(node.proposals(), proposals);
    // Without an id the same delete is NotFound; under another
    // request's id, a conflict.
    let e = apply_plain(&node, delete.clone()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    let e = once(&node, "a1", delete).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
}

async fn apply_plain(
    node: &MemoryNode,
    request: OperatorRequest,
) -> Result<OperatorResponse, WireError> {
    apply(node, node.clock(), &settings(), request).await
}

#[tokio::test]
async fn a_refusal_is_recorded_and_answered_again() {
    let node = MemoryNode::new();
    let stop = OperatorRequest::SetDesiredState(SetDesiredState {
        id: "dep_missing".into(),
        desired_state: DesiredState::Standby,
        after_ms: None,
        force: true,
    });
    let e = once(&node, "r1", stop.clone()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert_eq!(once(&node, "r1", stop).await.unwrap_err(), e);
}

#[tokio::test]
async fn a_request_with_an_id_proposes_once() {
    let node = MemoryNode::new();
    let request_id = id("r1");
    let once = Idempotent {
        state: &node,
        request_id: &request_id,
        actor: ACTOR,
        fingerprint: [1; 32],
        proposed: AtomicBool::new(false),
    };
    let create = |i: usize| {
        Mutation::CreateDeployment(mutations::CreateDeployment {
            deployment: wire::model::Deployment {
                id: format!("dep_{i}"),
                workspace_id: "ws".into(),
                project_id: "proj".into(),
                environment_id: "env".into(),
                image: "nginx".into(),
                cpu_millicores: 1,
                memory_mib: 1,
                replicas: 1,
                regions: vec!["us-east".into()],
                env_vars: Default::default(),
                desired_state: DesiredState::Running,
                status: wire::model::DeploymentStatus::Pending,
                created_at_ms: 1,
                updated_at_ms: 1,
                workflow: Default::default(),
                spec: Default::default(),
            },
        })
    };
    let e = once.propose(vec![create(1), create(2)]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal);
    assert_eq!(node.proposals(), 0);
    let e = once.propose(vec![create(3)]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal, "the one proposal was spent");
}

#[tokio::test]
async fn an_invalid_request_id_is_refused() {
    let node = MemoryNode::new();
    let bad: RequestId = postcard::from_bytes(&postcard::to_allocvec("a b").unwrap()).unwrap();
    let e = apply_once(&node, node.clock(), &settings(), &bad, ACTOR, create())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert_eq!(node.proposals(), 0);
}

#[test]
fn a_fingerprint_hides_secret_values_behind_the_key() {
    let node = crate::app::testing::MemoryNode::new();
    let with = |value: &str| {
        let mut create = crate::app::testing::create_request(&["us-east"]);
        create.spec.secret_env.insert(
            "DB".into(),
            wire::workload::SecretValue::Plain(value.into()),
        );
        OperatorRequest::CreateDeployment(create)
    };
    let one = fingerprint(node.keyring(), &with("hunter2")).unwrap();
    assert_eq!(one, fingerprint(node.keyring(), &with("hunter2")).unwrap());
    assert_ne!(one, fingerprint(node.keyring(), &with("hunter3")).unwrap());
    let plain = postcard::to_allocvec(&with("hunter2")).unwrap();
    let bare = ring::digest::digest(&ring::digest::SHA256, &plain);
    assert_ne!(one.as_slice(), bare.as_ref(), "not a hash of the value");
}

/// Makes the deployment `id` (deploying) ready and its environment's
/// live one, by the workflow's transitions.
async fn make_live(node: &MemoryNode, id: &str) {
    use storage::command::{DeployAction, DeployTransition};
    use wire::model::DeploymentStatus;
    for action in [
        DeployAction::Advance {
            to: DeploymentStatus::Network,
            reason: "test".into(),
        },
        DeployAction::Advance {
            to: DeploymentStatus::Finalizing,
            reason: "test".into(),
        },
        DeployAction::Finalize {
            standby_replaced_at_ms: 0,
        },
    ] {
        let d = node.read().unwrap().deployment(id).unwrap().unwrap();
        let out = node
            .propose(vec![Mutation::Deploy(DeployTransition {
                deployment_id: id.into(),
                expected: wire::rules::deploy::deploy_guard(&d),
                action,
            })])
            .await
            .unwrap();
        assert_eq!(out, vec![Ok(Outcome::Recorded)]);
    }
}

/// `ctrl stop` and `ctrl archive` of the live deployment: the operator's
/// request is refused unless it carries `--force` (now or scheduled);
/// with it, the deployment is set and no longer live.
#[tokio::test]
async fn stopping_or_archiving_the_live_deployment_takes_force() {
    let node = MemoryNode::new();
    let id = crate::app::deployments::testing::deployed(&node, &["us-east"]).await;
    make_live(&node, &id).await;
    let set = |desired_state, after_ms, force| {
        OperatorRequest::SetDesiredState(SetDesiredState {
            id: id.clone(),
            desired_state,
            after_ms,
            force,
        })
    };
    let before = hash(&node);
    for desired_state in [DesiredState::Stopped, DesiredState::Archived] {
        for after_ms in [None, Some(60_000)] {
            let e = apply_plain(&node, set(desired_state, after_ms, false))
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::FailedPrecondition, "{e}");
            assert!(e.message.contains("with force"), "{}", e.message);
        }
    }
    assert_eq!(hash(&node), before, "refused: nothing written");
    let live = || {
        node.read()
            .unwrap()
            .environment("env")
            .unwrap()
            .unwrap()
            .live_deployment_id
    };
    assert_eq!(live().as_deref(), Some(id.as_str()));
    apply_plain(&node, set(DesiredState::Archived, None, true))
        .await
        .unwrap();
    let d = node.read().unwrap().deployment(&id).unwrap().unwrap();
    assert_eq!(d.desired_state, DesiredState::Archived);
    assert_eq!(live(), None);
}
