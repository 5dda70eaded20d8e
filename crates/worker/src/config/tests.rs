//! The configuration file as a whole: the template documents exactly the defaults, every
//! mistake names its key (or its line), and each section's checks hold when read from a file.

use super::*;
use sprout_engine::config::GvisorNetwork;

#[test]
fn template_documents_exactly_the_defaults() {
    assert_eq!(Config::parse(TEMPLATE).unwrap(), Config::default());
}

#[test]
fn every_key_of_the_defaults_is_in_the_template() {
    let defaults = toml::to_string(&Config::default()).unwrap();
    let mut section = String::new();
    for line in defaults.lines() {
        if let Some(name) = line.strip_prefix('[') {
            section = name.trim_end_matches(']').to_string();
        } else if let Some((key, _)) = line.split_once(" = ") {
            let in_template = TEMPLATE
                .split(&format!("[{section}]"))
                .nth(1)
                .map(|rest| rest.split("\n[").next().unwrap_or("").contains(&format!("\n{key} = ")))
                .unwrap_or(false);
            assert!(in_template, "{section}.{key} is not documented in the template");
        }
    }
}

#[test]
fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
    let err = Config::parse("[limits]\nmemroy_mb = 5\n").unwrap_err();
    assert!(format!("{err:#}").contains("memroy_mb"), "{err:#}");
    let err = Config::parse("[limits]\nmemory_mb = \"lots\"\n").unwrap_err();
    assert!(format!("{err:#}").contains("memory_mb"), "{err:#}");
    let err = Config::parse("[worker]\nlisten = \"nowhere\"\n").unwrap_err();
    assert!(format!("{err:#}").contains("worker.listen"), "{err:#}");
    let err = Config::parse("[sandbox]\nbackend = \"firecracker\"\n").unwrap_err();
    assert!(format!("{err:#}").contains("firecracker"), "{err:#}");
    let err = Config::parse("[gvisor]\nnetwork = \"bridge\"\n").unwrap_err();
    assert!(format!("{err:#}").contains("bridge"), "{err:#}");
    assert_eq!(Config::parse("[gvisor]\nnetwork = \"host\"\n").unwrap().gvisor.network, GvisorNetwork::Host);
    let err = Config::parse("[limits]\ntimeout_ms = 0\n").unwrap_err();
    assert!(format!("{err:#}").contains("timeout_ms"), "{err:#}");
}

#[test]
fn partial_files_keep_the_other_defaults() {
    let c = Config::parse("[instances]\nkeep_warm = false\n").unwrap();
    assert!(!c.instances.keep_warm);
    assert_eq!(c.limits, Config::default().limits);
}

mod isolation {
    use crate::config::Config;

    fn refused(text: &str) -> String {
        format!("{:#}", Config::parse(text).unwrap_err())
    }

    #[test]
    fn classes_run_beside_a_default_that_can_share_a_worker() {
        let config = Config::parse("[isolation]\nclasses = [\"gvisor\"]\nlambdas = { billing = \"gvisor\", plain = \"sock\" }\n").unwrap();
        assert_eq!(config.isolation.lambdas.len(), 2);
        assert!(refused("[sandbox]\nbackend = \"docker\"\n[isolation]\nclasses = [\"gvisor\"]\n").contains("needs sandbox.backend"));
        assert!(refused("[isolation]\nclasses = [\"vm\"]\n").contains("not vm"));
        assert!(refused("[isolation]\nclasses = [\"sock-nozygote\"]\n").contains("one lean back-end"));
        assert!(refused("[isolation]\nclasses = [\"nonsense\"]\n").contains("unknown variant"));
    }

    #[test]
    fn a_lambda_may_be_given_only_a_class_the_worker_runs() {
        assert!(refused("[isolation]\nlambdas = { billing = \"gvisor\" }\n").contains("add it to isolation.classes"));
        assert!(refused("[isolation]\nclasses = [\"gvisor\"]\nlambdas = { \"../x\" = \"gvisor\" }\n").contains("not a lambda name"));
    }
}

mod network {
    use crate::config::Config;

    fn error(text: &str) -> String {
        format!("{:#}", Config::parse(text).unwrap_err())
    }

    #[test]
    fn services_parse_with_defaults() {
        let c = Config::parse(
            "[network]\n[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:5432\"\n\n[[network.allow]]\nname = \"cache\"\naddress = \"10.1.2.3:11211\"\nprotocol = \"udp\"\nlambdas = [\"visits\"]\n",
        )
        .unwrap();
        let services = c.network.services();
        assert_eq!(services.len(), 2);
        assert_eq!(services[0].target.to_string(), "127.0.0.1:5432");
        assert_eq!(services[0].lambdas, None);
        assert_eq!(services[1].protocol, sprout_sandbox::network::Protocol::Udp);
        assert_eq!(services[1].lambdas.as_deref(), Some(&["visits".to_string()][..]));
    }

    #[test]
    fn a_malformed_allowlist_names_the_line_and_the_reason() {
        let head = "[worker]\nlog = \"info\"\n\n[network]\n";
        let cases = [
            ("[[network.allow]]\nname = \"db\"\naddress = \"localhost:5432\"\n", "line 5: network.allow[0].address", "IPv4 address and port"),
            ("[[network.allow]]\nname = \"Bad_Name\"\naddress = \"127.0.0.1:1\"\n", "line 5: network.allow[0].name", "lower-case"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:0\"\n", "line 5", "port other than 0"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nprotocol = \"sctp\"\n", "line 5: network.allow[0].protocol", "\"tcp\" or \"udp\""),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nlambdas = []\n", "network.allow[0].lambdas is empty", "leave it out"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nlambdas = [\"../x\"]\n", "network.allow[0].lambdas", "not a lambda name"),
            (
                "[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\n\n[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:2\"\n",
                "line 9: network.allow[1].name",
                "already the name of network.allow[0]",
            ),
            (
                "[[network.allow]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\n[[network.allow]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\n",
                "line 9: network.allow[1].address",
                "already network.allow[0]",
            ),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nport = 3\n", "line 8", "unknown field `port`"),
            ("[[network.allow]]\nname = \"db\"\n", "line 5", "missing field `address`"),
        ];
        for (body, place, reason) in cases {
            let err = error(&format!("{head}{body}"));
            assert!(err.contains(place) && err.contains(reason), "{body:?}: {err}");
        }
    }

    #[test]
    fn subnet_and_sizes_are_checked() {
        assert!(error("[network]\nsubnet = \"10.0.0.0/8\"\n").contains("network.subnet"));
        assert!(error("[network]\nsubnet = \"8.8.0.0/16\"\n").contains("private"));
        assert!(error("[network]\npool = 10\nmax_namespaces = 10\n").contains("network.pool"));
        assert_eq!(Config::parse("[network]\nsubnet = \"10.9.0.0/18\"\n").unwrap().network.block().unwrap().to_string(), "10.9.0.0/18");
    }
}
