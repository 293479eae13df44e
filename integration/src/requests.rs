//! Operator requests the benchmarks and tests send, built in one place.

use std::collections::BTreeMap;

use wire::operator::{CreateDeployment, OperatorRequest};

/// A deployment of one small replica (`nginx:1.27`, 100 millicores,
/// 128 MiB) in each of `regions`, in workspace `ws`, project `proj`,
/// environment `env`.
pub fn create_deployment<R: Into<String>>(regions: impl IntoIterator<Item = R>) -> OperatorRequest {
    create_deployment_with_replicas(regions, 1)
}

/// [`create_deployment`] with `replicas` replicas per region.
pub fn create_deployment_with_replicas<R: Into<String>>(
    regions: impl IntoIterator<Item = R>,
    replicas: u32,
) -> OperatorRequest {
    OperatorRequest::CreateDeployment(CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: "env".into(),
        image: "nginx:1.27".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas,
        regions: regions.into_iter().map(Into::into).collect(),
        env_vars: BTreeMap::new(),
    })
}
