//! PCI addresses as Tessera stores and publishes them.

/// Normalizes a PCI bus id to the extended BDF form `dddd:bb:dd.f` in lower case, as upstream's
/// `resource.kubernetes.io/pciBusID` expects. Accepts NVML's `busId` (`00000000:18:00.0`, eight
/// hex digits of domain), its `busIdLegacy` (`0000:18:00.0`) and upper-case hex. `None` when the
/// text is not a BDF or the domain does not fit in 16 bits.
pub fn normalize_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, max_len: usize| {
        (!s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let domain = hex(domain, 8).filter(|d| *d <= 0xffff)?;
    let bus = hex(bus, 2)?;
    let device = hex(device, 2).filter(|d| *d <= 0x1f)?;
    let function = hex(function, 1).filter(|f| *f <= 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// Whether `root` has upstream's PCIe root form `pci<domain>:<bus>` (`pci0000:00`), the name of
/// the root complex directory under `/sys/devices`.
pub fn is_pcie_root(root: &str) -> bool {
    let Some(rest) = root.strip_prefix("pci") else {
        return false;
    };
    let Some((domain, bus)) = rest.split_once(':') else {
        return false;
    };
    let is_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    is_hex(domain, 4) && is_hex(bus, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalize_to_extended_bdf() {
        for (input, want) in [
            ("00000000:18:00.0", "0000:18:00.0"),
            ("0000:2A:00.0", "0000:2a:00.0"),
            ("0001:db:1f.7", "0001:db:1f.7"),
        ] {
            assert_eq!(normalize_bus_id(input).as_deref(), Some(want), "{input}");
        }
        for bad in [
            "",
            "18:00.0",
            "0000:18:00",
            "0000:18:20.0",
            "0000:18:00.8",
            "10000:18:00.0",
            "0000:xyz:00.0",
        ] {
            assert_eq!(normalize_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn pcie_roots() {
        assert!(is_pcie_root("pci0000:00"));
        assert!(is_pcie_root("pci0000:d7"));
        assert!(!is_pcie_root("pci0000:D7"));
        assert!(!is_pcie_root("0000:00"));
        assert!(!is_pcie_root("pci00:00"));
    }
}
