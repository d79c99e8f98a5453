//! Which network interface a rank's sockets use: `UNIHAL_SOCKET_IFNAME`, read as
//! `NCCL_SOCKET_IFNAME` is, so one setting serves a cluster's NCCL and unihal alike.
//!
//! The value is a comma-separated list of interface-name prefixes (`eth,ib`); a leading `^`
//! excludes the listed ones instead; a leading `=` (after `^`, if any) makes the names exact.
//! The first interface, in the system's order, that is up, has an IPv4 address and matches is
//! chosen. Unset, callers keep their own defaults (the host name's address, as PyTorch's gloo
//! does). A setting that matches nothing fails, listing the interfaces there are: a rank that
//! silently bound another address would be unreachable from a second host.

use unihal_hal::{HalError, Invalid, Result};

/// The variable.
pub const VAR: &str = "UNIHAL_SOCKET_IFNAME";

/// A chosen interface and its IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketIf {
    pub name: String,
    pub addr: std::net::Ipv4Addr,
}

/// A parsed interface selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl Selection {
    /// Parses NCCL's syntax (see the module docs).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for an empty list.
    pub fn parse(value: &str) -> Result<Selection> {
        let (exclude, rest) = value
            .strip_prefix('^')
            .map_or((false, value), |r| (true, r));
        let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(HalError::invalid(
                VAR,
                Invalid::Other(format!(
                    "{value:?} names no interface: give prefixes such as eth0,ib (^ to exclude, = \
                     for exact names)"
                )),
            ));
        }
        Ok(Selection {
            exclude,
            exact,
            names,
        })
    }

    /// Whether interface `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// The interfaces that are up, with their IPv4 addresses, in the system's order.
///
/// # Errors
/// [`HalError::Internal`] when the system cannot list them.
pub fn interfaces() -> Result<Vec<SocketIf>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(HalError::Internal(format!(
            "getifaddrs: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut out = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs made, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null address of the node; its family says which struct it is.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: a non-null, NUL-terminated name of the node.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(SocketIf {
            name,
            addr: std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        });
    }
    // SAFETY: the list getifaddrs made, freed once; no reference into it outlives this.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// The interface `UNIHAL_SOCKET_IFNAME` selects, or `None` when it is unset or empty.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming the variable when it matches no interface that is up
/// with an IPv4 address (the message lists them), or is malformed.
pub fn selected() -> Result<Option<SocketIf>> {
    let Ok(value) = std::env::var(VAR) else {
        return Ok(None);
    };
    if value.trim().is_empty() {
        return Ok(None);
    }
    let sel = Selection::parse(&value)?;
    let all = interfaces()?;
    all.iter()
        .find(|i| sel.matches(&i.name))
        .cloned()
        .map(Some)
        .ok_or_else(|| {
            let have: Vec<String> = all
                .iter()
                .map(|i| format!("{} {}", i.name, i.addr))
                .collect();
            HalError::invalid(
                VAR,
                Invalid::Other(format!(
                    "{value:?} matches no interface that is up with an IPv4 address (there are: \
                     {})",
                    have.join(", ")
                )),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_read_as_nccl_reads_them() {
        let s = Selection::parse("eth,ib").unwrap();
        assert!(s.matches("eth0") && s.matches("ib1") && !s.matches("lo"));
        let s = Selection::parse("^docker,lo").unwrap();
        assert!(!s.matches("docker0") && !s.matches("lo") && s.matches("eth0"));
        let s = Selection::parse("=eth0").unwrap();
        assert!(s.matches("eth0") && !s.matches("eth01"));
        let s = Selection::parse("^=eth0").unwrap();
        assert!(!s.matches("eth0") && s.matches("eth01"));
        assert!(Selection::parse("^").is_err());
        assert!(Selection::parse(" , ").is_err());
    }

    #[test]
    fn the_loopback_interface_is_listed() {
        let all = interfaces().unwrap();
        assert!(
            all.iter().any(|i| i.addr.is_loopback()),
            "no loopback interface among {all:?}"
        );
    }
}
