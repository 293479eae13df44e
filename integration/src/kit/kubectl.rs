//! The real `kubectl` against a simulated cluster: `/usr/bin/kubectl`, or
//! the program `$KUBECTL` names. Every run is bounded by a timeout and
//! killed when it expires (a [`Cli`]).

use std::path::Path;

use super::process::Cli;

/// Names the kubectl to run instead of [`KUBECTL_DEFAULT`].
pub const KUBECTL_ENV: &str = "KUBECTL";
/// The kubectl run when `KUBECTL` is unset (Debian's `kubernetes-client`).
pub const KUBECTL_DEFAULT: &str = "/usr/bin/kubectl";

/// `kubectl --kubeconfig KUBECONFIG --cache-dir KUBECONFIG.cache`: its
/// discovery cache sits beside the kubeconfig, never in the home
/// directory.
pub fn kubectl(kubeconfig: &Path) -> Cli {
    let program = std::env::var_os(KUBECTL_ENV).unwrap_or_else(|| KUBECTL_DEFAULT.into());
    let cache = kubeconfig.with_extension("cache");
    Cli::new(program)
        .leading_args([
            "--kubeconfig".into(),
            kubeconfig.as_os_str().to_owned(),
            "--cache-dir".into(),
            cache.into_os_string(),
        ])
        .missing_hint(&format!(
            "no kubectl at {}; set {KUBECTL_ENV} to its path",
            std::env::var(KUBECTL_ENV).unwrap_or_else(|_| KUBECTL_DEFAULT.into())
        ))
}
