//! Which back-end runs each lambda, its isolation class: the operator's choice (made at
//! upload, else `[isolation] lambdas` in the configuration, else `sandbox.backend`), raised
//! but never lowered by the class the lambda's own `ol.yaml` asks for. A pure policy; the
//! back-ends themselves are held by [`crate::backends::Backends`].

use std::collections::BTreeMap;

use crate::config::BackendKind;

/// How strong a class's boundary is: the host kernel's namespaces alone (the lean
/// sandboxes), a container runtime's (still the host kernel), or a second kernel.
pub fn strength(kind: BackendKind) -> u8 {
    match kind {
        BackendKind::Sock | BackendKind::SockNoZygote => 0,
        BackendKind::Runc | BackendKind::Docker => 1,
        BackendKind::Gvisor | BackendKind::Vm => 2,
    }
}

/// Why a lambda has no class this worker can serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("isolation class {asked:?} is not served by this worker (it runs {})", names(available))]
pub struct Unavailable {
    pub asked: String,
    pub available: Vec<BackendKind>,
}

fn names(kinds: &[BackendKind]) -> String {
    kinds.iter().map(|k| format!("{:?}", k.name())).collect::<Vec<_>>().join(", ")
}

/// The worker's classes and the operator's per-lambda choices.
#[derive(Debug, Clone)]
pub struct Isolation {
    available: Vec<BackendKind>,
    lambdas: BTreeMap<String, BackendKind>,
}

impl Isolation {
    /// `default` first, then each of `extra` not already there.
    pub fn new(default: BackendKind, extra: &[BackendKind], lambdas: BTreeMap<String, BackendKind>) -> Isolation {
        let mut available = vec![default];
        for kind in extra {
            if !available.contains(kind) {
                available.push(*kind);
            }
        }
        Isolation { available, lambdas }
    }

    /// Every class this worker runs, its default first.
    pub fn available(&self) -> &[BackendKind] {
        &self.available
    }

    /// A class by its name, if this worker runs it.
    pub fn parse(&self, name: &str) -> Result<BackendKind, Unavailable> {
        let unavailable = || Unavailable { asked: name.to_string(), available: self.available.clone() };
        let kind = BackendKind::from_name(name).ok_or_else(unavailable)?;
        self.available.contains(&kind).then_some(kind).ok_or_else(unavailable)
    }

    /// The class the operator gave `lambda`: `chosen` at upload, else the configuration's
    /// entry for it, else the default.
    pub fn operator_class(&self, lambda: &str, chosen: Option<BackendKind>) -> BackendKind {
        chosen.or_else(|| self.lambdas.get(lambda).copied()).unwrap_or(self.available[0])
    }

    /// The class `lambda` runs in: the operator's, or what its `ol.yaml` `asked` for when that
    /// is stronger. A stronger class this worker does not run is an error, never a weaker one
    /// served instead; so is an operator's class it no longer runs.
    pub fn class(&self, lambda: &str, chosen: Option<BackendKind>, asked: Option<BackendKind>) -> Result<BackendKind, Unavailable> {
        let operator = self.operator_class(lambda, chosen);
        let class = match asked {
            Some(asked) if strength(asked) > strength(operator) => asked,
            _ => operator,
        };
        self.parse(class.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BackendKind::{Gvisor, Runc, Sock, SockNoZygote};

    fn worker(lambdas: &[(&str, BackendKind)]) -> Isolation {
        Isolation::new(Sock, &[Gvisor, Sock], lambdas.iter().map(|(n, k)| (n.to_string(), *k)).collect())
    }

    #[test]
    fn the_default_serves_every_lambda_the_operator_left_alone() {
        let w = worker(&[]);
        assert_eq!(w.available(), &[Sock, Gvisor]);
        assert_eq!(w.class("a", None, None), Ok(Sock));
    }

    #[test]
    fn the_operators_choice_at_upload_beats_the_configuration_which_beats_the_default() {
        let w = worker(&[("billing", Gvisor)]);
        assert_eq!(w.class("billing", None, None), Ok(Gvisor));
        assert_eq!(w.class("billing", Some(Sock), None), Ok(Sock), "the operator may lower their own choice");
        assert_eq!(w.class("other", Some(Gvisor), None), Ok(Gvisor));
    }

    #[test]
    fn a_tenants_ol_yaml_raises_the_class_but_never_lowers_it() {
        let w = worker(&[("billing", Gvisor)]);
        assert_eq!(w.class("billing", None, Some(Sock)), Ok(Gvisor));
        assert_eq!(w.class("billing", None, Some(SockNoZygote)), Ok(Gvisor));
        assert_eq!(w.class("plain", None, Some(Gvisor)), Ok(Gvisor));
        // Of equal strength, the operator's stands.
        assert_eq!(w.class("plain", None, Some(SockNoZygote)), Ok(Sock));
    }

    #[test]
    fn a_stronger_class_the_worker_does_not_run_is_refused_not_weakened() {
        let w = worker(&[]);
        let err = w.class("a", None, Some(Runc)).unwrap_err();
        assert_eq!(err.asked, "runc");
        assert_eq!(err.to_string(), "isolation class \"runc\" is not served by this worker (it runs \"sock\", \"gvisor\")");
        let lean_only = Isolation::new(Sock, &[], [("billing".to_string(), Gvisor)].into());
        assert!(lean_only.class("billing", None, None).is_err(), "a configured class the worker lacks fails");
    }

    #[test]
    fn names_parse_only_to_classes_the_worker_runs() {
        let w = worker(&[]);
        assert_eq!(w.parse("gvisor"), Ok(Gvisor));
        assert!(w.parse("runc").is_err());
        assert!(w.parse("firecracker").is_err());
    }
}
