//! `/proc/self/mountinfo`, parsed in one place: each mount's mount point, file-system type,
//! source and options (proc(5)), with the octal escapes of paths (`\040` for a space) undone.

use std::io;
use std::path::PathBuf;

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted (field 5).
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. `rw,nosuid` (field 6).
    pub mount_options: String,
    /// The file-system type after the ` - ` separator, e.g. `cgroup2`.
    pub fs_type: String,
    /// The source, e.g. `/dev/sda1` or `cgroup`.
    pub source: String,
    /// Per-superblock options, e.g. `rw,memory` for a v1 cgroup hierarchy.
    pub super_options: String,
}

/// The mounts of this process's mount namespace.
pub fn read() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mounts described by mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    let mut after = right.split(' ');
    let (fs_type, source, super_options) = (after.next()?, after.next()?, after.next().unwrap_or(""));
    Some(Mount {
        mount_point: PathBuf::from(unescape(fields.get(4)?)),
        mount_options: fields.get(5)?.to_string(),
        fs_type: fs_type.to_string(),
        source: unescape(source),
        super_options: super_options.to_string(),
    })
}

/// Undo mountinfo's octal escapes (`\040` is a space, `\134` a backslash).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate,favordynmods
40 22 8:1 /home/a\\040b /mnt/with\\040space ro,relatime - ext4 /dev/sda1 rw
41 22 0:50 / /opt/no\\134slash rw shared:3 master:2 - tmpfs tmpfs rw
this line is not mountinfo
";

    #[test]
    fn every_field_is_read_past_optional_fields_and_escapes() {
        let mounts = parse(SAMPLE);
        assert_eq!(mounts.len(), 5, "the malformed line is skipped");
        assert_eq!(mounts[1].mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!((mounts[1].fs_type.as_str(), mounts[1].super_options.as_str()), ("cgroup", "rw,memory"));
        assert_eq!(mounts[2].fs_type, "cgroup2");
        assert!(mounts[2].super_options.split(',').any(|o| o == "favordynmods"));
        assert_eq!(mounts[3].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(mounts[3].mount_options, "ro,relatime");
        assert_eq!(mounts[4].mount_point, PathBuf::from("/opt/no\\slash"));
        assert_eq!(mounts[4].fs_type, "tmpfs", "two optional fields before the separator");
    }

    #[test]
    fn unescapes_mountinfo_fields() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/x\\134y"), "/x\\y");
        assert_eq!(unescape("/trail\\04"), "/trail\\04");
    }

    #[test]
    fn this_process_has_a_root_mount() {
        assert!(read().unwrap().iter().any(|m| m.mount_point == std::path::Path::new("/")));
    }
}
