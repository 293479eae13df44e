//! Tests of `integration/k8s-sim/src/controller`.

use super::*;

const WALL: &str = "2024-01-01T00:00:00Z";

fn sts(replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "web"},
           "spec": {"replicas": replicas, "serviceName": "web",
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "app", "image": image}]}}}})
}

fn pods(store: &Store) -> Vec<Value> {
    store.range(&PODS, None).map(|(_, p)| p.clone()).collect()
}

fn pass(
    c: &mut Controller,
    store: &mut Store,
    settings: &Settings,
    now: Instant,
) -> Option<Instant> {
    let mut next = None;
    for _ in 0..PASSES_MAX {
        let before = store.resource_version();
        next = c.reconcile(store, settings, now, WALL);
        if store.resource_version() == before {
            break;
        }
    }
    next
}

#[test]
fn statefulset_pods_start_after_the_delay_and_follow_scale() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::default();
    let settings = Settings {
        pod_ready_delay: Duration::from_secs(5),
        failing_images: vec![],
        failing_readiness: vec![],
        refusing_images: vec![],
        image_faults: vec![],
        refused_deletes: vec![],
        denied_images: vec![],
    };
    let t0 = Instant::now();
    store
        .create(
            &STATEFUL_SETS,
            "default",
            sts(2, "app:1"),
            WALL,
            WriteOpts::default(),
        )
        .unwrap();
    let next = pass(&mut c, &mut store, &settings, t0);
    assert_eq!(next, Some(t0 + Duration::from_secs(5)));
    let names: Vec<String> = pods(&store)
        .iter()
        .map(|p| meta::name_of(p).to_string())
        .collect();
    assert_eq!(names, ["web-0", "web-1"]);
    assert!(
        pods(&store)
            .iter()
            .all(|p| p["status"]["phase"] == "Pending")
    );
    assert!(pass(&mut c, &mut store, &settings, t0 + Duration::from_secs(5)).is_none());
    assert!(pods(&store).iter().all(pod_ready));
    let ips: HashSet<String> = pods(&store)
        .iter()
        .map(|p| p["status"]["podIP"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ips.len(), 2);
    let key = Key::new(&STATEFUL_SETS, "default", "web");
    let status = &store.get(&key).unwrap()["status"];
    assert_eq!(
        (
            status["replicas"].as_i64(),
            status["readyReplicas"].as_i64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(status["observedGeneration"], 1);

    store
        .update(&key, sts(1, "app:1"), Part::Main, WriteOpts::default())
        .unwrap();
    pass(&mut c, &mut store, &settings, t0 + Duration::from_secs(6));
    assert_eq!(pods(&store).len(), 1);
    let status = &store.get(&key).unwrap()["status"];
    assert_eq!(
        (
            status["replicas"].as_i64(),
            status["observedGeneration"].as_i64()
        ),
        (Some(1), Some(2))
    );
    // A settled pass changes nothing.
    let rv = store.resource_version();
    pass(&mut c, &mut store, &settings, t0 + Duration::from_secs(7));
    assert_eq!(store.resource_version(), rv);
}

fn named_sts(name: &str, replicas: i64) -> Value {
    let mut o = sts(replicas, "app:1");
    o["metadata"]["name"] = json!(name);
    o["spec"]["selector"]["matchLabels"]["app"] = json!(name);
    o["spec"]["template"]["metadata"]["labels"]["app"] = json!(name);
    o
}

/// The names of the objects the events after `rv` changed.
fn changed_since(store: &Store, rv: u64) -> Vec<String> {
    store
        .events_since(rv)
        .unwrap()
        .map(|e| meta::name_of(&e.object).to_string())
        .collect()
}

fn all_ready(store: &Store, count: usize, replicas: i64) -> bool {
    let ready = store
        .range(&STATEFUL_SETS, None)
        .filter(|(_, o)| o["status"]["readyReplicas"].as_i64() == Some(replicas))
        .count();
    ready == count && pods(store).len() == count * count_of(replicas)
}

#[test]
fn a_pass_touches_only_what_changed() {
    let mut store = Store::new(10_000, 1);
    let mut c = Controller::default();
    let settings = Settings::default();
    let t0 = Instant::now();
    for i in 0..200 {
        let o = named_sts(&format!("s{i:03}"), 1);
        let opts = WriteOpts::default();
        store
            .create(&STATEFUL_SETS, "default", o, WALL, opts)
            .unwrap();
    }
    pass(&mut c, &mut store, &settings, t0);
    assert!(all_ready(&store, 200, 1));

    // Scaling one StatefulSet reconciles that one alone: each phase
    // looks at it once, and every write is its own or its pod's.
    let rv = store.resource_version();
    let key = Key::new(&STATEFUL_SETS, "default", "s057");
    store
        .update(&key, named_sts("s057", 2), Part::Main, WriteOpts::default())
        .unwrap();
    c.reconcile(&mut store, &settings, t0, WALL);
    let stats = c.last_pass();
    assert_eq!((stats.full, stats.workloads, stats.pods), (false, 2, 1));
    pass(&mut c, &mut store, &settings, t0);
    let changed = changed_since(&store, rv);
    // The scale, the new pod's creation and start, one status write.
    assert_eq!(changed, ["s057", "s057-1", "s057-1", "s057"]);
    assert_eq!(store.get(&key).unwrap()["status"]["readyReplicas"], 2);

    // A pass with nothing new looks at nothing.
    c.reconcile(&mut store, &settings, t0, WALL);
    assert_eq!(c.last_pass(), PassStats::default());

    // Deleting a StatefulSet but orphaning its pods: the controller
    // deletes those pods, and only those.
    let rv = store.resource_version();
    let key = Key::new(&STATEFUL_SETS, "default", "s100");
    store.delete(&key, false, WriteOpts::default()).unwrap();
    pass(&mut c, &mut store, &settings, t0);
    assert_eq!(changed_since(&store, rv), ["s100", "s100-0"]);
    assert!(!c.last_pass().full);

    // A pod deleted by hand comes back; its owner's status follows.
    let rv = store.resource_version();
    delete_pod(&mut store, "default", "s001-0");
    pass(&mut c, &mut store, &settings, t0);
    let changed = changed_since(&store, rv);
    assert!(changed.iter().all(|n| n.starts_with("s001")), "{changed:?}");
    assert_eq!(pods(&store).len(), 200);
    assert!(pods(&store).iter().all(pod_ready));
}

#[test]
fn a_compacted_history_falls_back_to_a_full_pass() {
    let mut store = Store::new(8, 1);
    let mut c = Controller::default();
    let settings = Settings {
        pod_ready_delay: Duration::from_secs(1),
        failing_images: vec![],
        failing_readiness: vec![],
        refusing_images: vec![],
        image_faults: vec![],
        refused_deletes: vec![],
        denied_images: vec![],
    };
    let t0 = Instant::now();
    let opts = WriteOpts::default();
    store
        .create(&STATEFUL_SETS, "default", named_sts("first", 1), WALL, opts)
        .unwrap();
    c.reconcile(&mut store, &settings, t0, WALL);
    assert!(c.last_pass().full, "the first pass is a full one");
    pass(&mut c, &mut store, &settings, t0);
    assert!(!c.last_pass().full);
    // More changes than the history keeps.
    for i in 0..20 {
        let o = named_sts(&format!("s{i:02}"), 2);
        store
            .create(&STATEFUL_SETS, "default", o, WALL, opts)
            .unwrap();
    }
    assert!(store.compacted_rv() > c.seen_rv.unwrap());
    c.reconcile(&mut store, &settings, t0, WALL);
    assert!(c.last_pass().full);
    // Every pod is waiting; the deadline index still wakes the pass.
    let due = pass(&mut c, &mut store, &settings, t0);
    assert_eq!(due, Some(t0 + Duration::from_secs(1)));
    assert_eq!(pods(&store).len(), 41);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(pass(&mut c, &mut store, &settings, t1), None);
    assert!(pods(&store).iter().all(pod_ready));
    let ready = |name: &str| {
        let key = Key::new(&STATEFUL_SETS, "default", name);
        store.get(&key).unwrap()["status"]["readyReplicas"].clone()
    };
    assert_eq!(
        (ready("first"), ready("s00"), ready("s19")),
        (json!(1), json!(2), json!(2))
    );

    // An orphaning delete lost to compaction is still found.
    let key = Key::new(&STATEFUL_SETS, "default", "s05");
    store.delete(&key, false, opts).unwrap();
    for i in 0..10 {
        let o = named_sts(&format!("t{i}"), 0);
        store
            .create(&STATEFUL_SETS, "default", o, WALL, opts)
            .unwrap();
    }
    pass(&mut c, &mut store, &settings, t1);
    assert_eq!(pods(&store).len(), 39);
    assert!(
        pods(&store)
            .iter()
            .all(|p| !meta::name_of(p).starts_with("s05"))
    );
}

#[test]
fn failing_images_stay_pending() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::default();
    let mut settings = Settings {
        pod_ready_delay: Duration::ZERO,
        failing_images: vec!["bad:1".into()],
        failing_readiness: vec![],
        refusing_images: vec![],
        image_faults: vec![],
        refused_deletes: vec![],
        denied_images: vec![],
    };
    let t0 = Instant::now();
    store
        .create(
            &STATEFUL_SETS,
            "default",
            sts(1, "bad:1"),
            WALL,
            WriteOpts::default(),
        )
        .unwrap();
    pass(&mut c, &mut store, &settings, t0);
    let pod = &pods(&store)[0];
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
        "ImagePullBackOff"
    );
    settings.failing_images.clear();
    pass(&mut c, &mut store, &settings, t0);
    assert!(pod_ready(&pods(&store)[0]));
}

#[test]
fn a_failing_readiness_probe_keeps_a_running_pod_unready() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::default();
    let mut settings = Settings {
        pod_ready_delay: Duration::ZERO,
        failing_images: vec![],
        failing_readiness: vec!["app:1".into()],
        refusing_images: vec![],
        image_faults: vec![],
        refused_deletes: vec![],
        denied_images: vec![],
    };
    let t0 = Instant::now();
    let mut probed = sts(1, "app:1");
    probed["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"path": "/healthz", "port": 8080}});
    store
        .create(
            &STATEFUL_SETS,
            "default",
            probed,
            WALL,
            WriteOpts::default(),
        )
        .unwrap();
    pass(&mut c, &mut store, &settings, t0);
    let pod = &pods(&store)[0];
    assert_eq!(pod["status"]["phase"], "Running");
    assert!(!pod_ready(pod));
    let container = &pod["status"]["containerStatuses"][0];
    assert_eq!(container["ready"], false);
    assert!(container["state"]["running"].is_object());
    // Without a probe the option changes nothing.
    store
        .create(
            &STATEFUL_SETS,
            "default",
            {
                let mut o = named_sts("plain", 1);
                o["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:1");
                o
            },
            WALL,
            WriteOpts::default(),
        )
        .unwrap();
    pass(&mut c, &mut store, &settings, t0);
    let plain: Vec<Value> = pods(&store)
        .into_iter()
        .filter(|p| p["metadata"]["name"] == "plain-0")
        .collect();
    assert!(pod_ready(&plain[0]));
    // The probe passing again: ready.
    settings.failing_readiness.clear();
    pass(&mut c, &mut store, &settings, t0);
    assert!(pods(&store).iter().all(pod_ready));
}

#[test]
fn deployment_rolls_to_a_new_template() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::default();
    let settings = Settings::default();
    let t0 = Instant::now();
    let mut d = sts(2, "app:1");
    d["kind"] = json!("Deployment");
    d["metadata"]["name"] = json!("sentinel");
    store
        .create(
            &DEPLOYMENTS,
            "default",
            d.clone(),
            WALL,
            WriteOpts::default(),
        )
        .unwrap();
    pass(&mut c, &mut store, &settings, t0);
    assert_eq!(pods(&store).len(), 2);
    assert!(
        pods(&store)
            .iter()
            .all(|p| meta::name_of(p).starts_with("sentinel-"))
    );
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
    let key = Key::new(&DEPLOYMENTS, "default", "sentinel");
    store
        .update(&key, d, Part::Main, WriteOpts::default())
        .unwrap();
    pass(&mut c, &mut store, &settings, t0);
    let images: Vec<Value> = pods(&store)
        .iter()
        .map(|p| p["spec"]["containers"][0]["image"].clone())
        .collect();
    assert_eq!(images, [json!("app:2"), json!("app:2")]);
    let status = &store.get(&key).unwrap()["status"];
    assert_eq!(
        (
            status["updatedReplicas"].as_i64(),
            status["availableReplicas"].as_i64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(status["observedGeneration"], 2);
}

fn uid_of(store: &Store, name: &str) -> String {
    let pod = store.get(&Key::new(&PODS, "default", name)).unwrap();
    meta::meta_str(pod, "uid").unwrap().to_string()
}

#[test]
fn loopback_pods_with_ports_are_served_until_they_go() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::new(PodNetwork::Loopback);
    let settings = Settings::default();
    let t0 = Instant::now();
    let mut web = sts(2, "app:1");
    web["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 8080}, {"containerPort": 8443}]);
    let opts = WriteOpts::default();
    store
        .create(&STATEFUL_SETS, "default", web.clone(), WALL, opts)
        .unwrap();
    store
        .create(&STATEFUL_SETS, "default", named_sts("quiet", 1), WALL, opts)
        .unwrap();
    // One pass starts the pods and records them served.
    c.reconcile(&mut store, &settings, t0, WALL);
    let changes = c.take_endpoint_changes();
    let served: Vec<(&str, &Endpoint)> = changes
        .iter()
        .map(|change| match change {
            EndpointChange::Serve { uid, endpoint } => (uid.as_str(), endpoint),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(served.len(), 2, "{changes:?}");
    for (uid, endpoint) in &served {
        let pod = store.get(store.key_of_uid(uid).unwrap()).unwrap();
        assert_eq!(pod["status"]["podIP"], json!(endpoint.ip.to_string()));
        assert!(endpoint.ip.is_loopback() && endpoint.ip.octets()[1] != 0);
        assert_eq!(endpoint.ports, [8080, 8443]);
        assert_eq!(endpoint.identity.name, meta::name_of(pod));
        assert_eq!(endpoint.identity.image, "app:1");
    }
    // The portless pod has a loopback address and no endpoint.
    let quiet = store.get(&Key::new(&PODS, "default", "quiet-0")).unwrap();
    let quiet_ip: std::net::Ipv4Addr = quiet["status"]["podIP"].as_str().unwrap().parse().unwrap();
    assert!(quiet_ip.is_loopback());
    pass(&mut c, &mut store, &settings, t0);
    assert_eq!(c.take_endpoint_changes(), []);

    // A label change: served again, same address, the new labels.
    let key = Key::new(&PODS, "default", "web-0");
    let mut pod = store.get(&key).unwrap().clone();
    let ip = pod["status"]["podIP"].clone();
    pod["metadata"]["labels"]["tier"] = json!("front");
    store.update(&key, pod, Part::Main, opts).unwrap();
    pass(&mut c, &mut store, &settings, t0);
    match c.take_endpoint_changes().as_slice() {
        [EndpointChange::Serve { uid, endpoint }] => {
            assert_eq!(*uid, uid_of(&store, "web-0"));
            assert_eq!(json!(endpoint.ip.to_string()), ip);
            assert_eq!(endpoint.identity.labels["tier"], "front");
        }
        other => panic!("{other:?}"),
    }

    // Scaled to one: web-1 stops. A full pass finds nothing more to do.
    let web_1 = uid_of(&store, "web-1");
    web["spec"]["replicas"] = json!(1);
    let sts_key = Key::new(&STATEFUL_SETS, "default", "web");
    store.update(&sts_key, web, Part::Main, opts).unwrap();
    pass(&mut c, &mut store, &settings, t0);
    assert_eq!(
        c.take_endpoint_changes(),
        [EndpointChange::Stop { uid: web_1 }]
    );
    let full = Settings {
        pod_ready_delay: Duration::from_millis(1),
        ..Settings::default()
    };
    c.reconcile(&mut store, &full, t0, WALL);
    assert!(c.last_pass().full);
    assert_eq!(c.take_endpoint_changes(), []);

    // Deleted with its StatefulSet: web-0 stops.
    let web_0 = uid_of(&store, "web-0");
    store.delete(&sts_key, true, opts).unwrap();
    pass(&mut c, &mut store, &full, t0);
    assert_eq!(
        c.take_endpoint_changes(),
        [EndpointChange::Stop { uid: web_0 }]
    );
}

#[test]
fn the_cluster_network_serves_nothing() {
    let mut store = Store::new(1000, 1);
    let mut c = Controller::default();
    let mut web = sts(1, "app:1");
    web["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80}]);
    store
        .create(&STATEFUL_SETS, "default", web, WALL, WriteOpts::default())
        .unwrap();
    pass(&mut c, &mut store, &Settings::default(), Instant::now());
    assert!(pod_ready(&pods(&store)[0]));
    assert!(
        pods(&store)[0]["status"]["podIP"]
            .as_str()
            .unwrap()
            .starts_with("10.")
    );
    assert_eq!(c.take_endpoint_changes(), []);
}
