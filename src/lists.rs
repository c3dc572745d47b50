//! The comma-separated lists the flags take: ports and cluster names.

/// Istio's infrastructure ports, whose connections are not application traffic (docs/how-it-works.md).
pub const ISTIO_INFRA_PORTS: &str = "15000,15004,15010,15012,15014,15020,15021,15053,15090";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSet(Vec<u16>);

impl PortSet {
    /// Parses `15000, 15021,15090`. Empty items are skipped, so `""` is the empty set and a
    /// trailing comma is harmless. The error is the item that is not a port.
    pub fn parse(list: &str) -> Result<PortSet, &str> {
        let items = list.split(',').map(str::trim).filter(|i| !i.is_empty());
        let ports = items.map(|i| i.parse().ok().filter(|&p| p > 0).ok_or(i));
        let mut ports: Vec<u16> = ports.collect::<Result<_, &str>>()?;
        ports.sort_unstable();
        ports.dedup();
        Ok(PortSet(ports))
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.binary_search(&port).is_ok()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The set with `port` too.
    pub(crate) fn with(mut self, port: u16) -> PortSet {
        if let Err(at) = self.0.binary_search(&port) {
            self.0.insert(at, port);
        }
        self
    }
}

impl std::fmt::Display for PortSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self.0.iter().map(u16::to_string).collect();
        f.write_str(&ports.join(","))
    }
}

/// `--ignore-clusters`: names, and prefixes written `name*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names(Vec<String>);

impl Names {
    /// Parses `a,b,c*`; empty items are skipped. The error is an item that is only `*`.
    pub fn parse(list: &str) -> Result<Names, &str> {
        let items = list.split(',').map(str::trim).filter(|i| !i.is_empty());
        let names = items.map(|i| if i == "*" { Err(i) } else { Ok(i.to_string()) });
        Ok(Names(names.collect::<Result<_, &str>>()?))
    }

    pub(crate) fn matches(&self, cluster: &str) -> bool {
        self.0.iter().any(|n| matches(n, cluster))
    }
}

/// Whether `name` is one of `patterns` (`matches`).
pub(crate) fn any(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|p| matches(p, name))
}

/// Whether `name` is `pattern`, whose one `*` stands for any run of characters (a trailing one:
/// a prefix).
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
        None => name == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_stands_for_any_run_of_characters() {
        for (pattern, name, want) in [
            ("kuma-dp-*", "kuma-dp-1", true),
            ("kuma-dp-*", "kuma-dp-", true),
            ("kuma-dp-*", "kuma-d", false),
            ("*", "anything", true),
            ("ab*b", "ab", false),
            ("ab*b", "abXb", true),
            ("*.sock", "admin.sock", true),
            ("*.sock", "admin.sock.old", false),
        ] {
            assert_eq!(matches(pattern, name), want, "{pattern} {name}");
        }
    }

    #[test]
    fn parses_lists_with_spaces_duplicates_and_trailing_commas_or_none() {
        let s = PortSet::parse(" 15021,15000, 15021,").unwrap();
        assert!(s.contains(15000) && s.contains(15021));
        assert!(!s.contains(15006));
        assert_eq!(s, PortSet::parse("15000,15021").unwrap());
        let empty = PortSet::parse("").unwrap();
        assert!(empty.is_empty() && !empty.contains(15000), "an empty list ignores nothing");
    }

    #[test]
    fn the_default_list_holds_istios_infrastructure_ports_but_not_traffic_ports() {
        let s = PortSet::parse(ISTIO_INFRA_PORTS).unwrap();
        for p in [15000, 15004, 15010, 15012, 15014, 15020, 15021, 15053, 15090] {
            assert!(s.contains(p), "{p} should be ignored");
        }
        for p in [15001, 15006, 15008, 15009, 80] {
            assert!(!s.contains(p), "{p} carries traffic");
        }
    }

    #[test]
    fn rejects_what_is_not_a_port_and_names_it() {
        assert_eq!(PortSet::parse("15000,http"), Err("http"));
        assert_eq!(PortSet::parse("0"), Err("0"));
        assert_eq!(PortSet::parse("65536"), Err("65536"));
        assert_eq!(PortSet::parse("-1"), Err("-1"));
    }

    #[test]
    fn only_a_lone_star_is_refused_as_a_cluster_name() {
        assert_eq!(Names::parse("*"), Err("*"));
        assert!(Names::parse("a*,b, ,").is_ok());
    }
}
