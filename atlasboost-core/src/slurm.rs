//! Slurm's compact notations, as its job environment uses them (SPEC §14): host lists
//! (`SLURM_JOB_NODELIST=node[01-04,07],gpu-[1-2]a`) and task counts per node
//! (`SLURM_TASKS_PER_NODE=2(x3),1`).
//!
//! The expansion follows Slurm's own (`scontrol show hostnames`, checked against it by the
//! real-Slurm test): names are split at commas outside brackets (empty ones skipped); each
//! bracket holds numbers and `lo-hi` ranges, zero-padded to the width of `lo` as written;
//! several brackets in one name expand as their product, the last varying fastest; order and
//! repeats are kept. One extension: text after the last bracket (`gpu-[1-2]a`) is a suffix of
//! every name, which Slurm 22.05's `scontrol` refuses and newer notations use.
//!
//! ```
//! use atlasboost_core::slurm::{expand_hostlist, expand_tasks_per_node};
//!
//! assert_eq!(
//!     expand_hostlist("node[01-03,07],gpu-[1-2]a").unwrap(),
//!     ["node01", "node02", "node03", "node07", "gpu-1a", "gpu-2a"]
//! );
//! assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
//! ```

/// The most names one host list may expand to: a typo like `node[1-99999999]` is an error, not
/// an allocation of gigabytes.
pub const MAX_HOSTS: usize = 1 << 20;

/// What is wrong with a host list or a task count list: the offending part and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{part:?}: {why}")]
pub struct NotationError {
    /// The part of the value that is wrong, as written.
    pub part: String,
    /// Why.
    pub why: String,
}

fn error(part: &str, why: impl Into<String>) -> NotationError {
    NotationError {
        part: part.to_string(),
        why: why.into(),
    }
}

/// Expands a Slurm host list into host names, in order.
///
/// # Errors
///
/// [`NotationError`] naming the name or range that is malformed (an unclosed or empty bracket,
/// a range that runs backwards, a number that is not one), an empty name, or a list of more
/// than [`MAX_HOSTS`] names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, NotationError> {
    let mut hosts = Vec::new();
    // Empty names (two commas) are skipped, as Slurm skips them.
    for item in split_top_level(list)?.into_iter().filter(|i| !i.is_empty()) {
        expand_item(item, &mut hosts)?;
    }
    if hosts.is_empty() {
        return Err(error(list, "no host"));
    }
    Ok(hosts)
}

/// Splits at the commas that are not inside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, NotationError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(error(list, "a bracket inside a bracket")),
            '[' => depth += 1,
            ']' if depth == 0 => return Err(error(list, "a `]` without its `[`")),
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(error(&list[start..], "a `[` without its `]`"));
    }
    items.push(&list[start..]);
    Ok(items)
}

/// One name with any number of bracket groups: `rack[1-2]-n[01-04]`.
fn expand_item(item: &str, hosts: &mut Vec<String>) -> Result<(), NotationError> {
    if item.chars().any(char::is_whitespace) {
        return Err(error(item, "white space in a host name"));
    }
    // The literal pieces and the bracket groups between them.
    let mut pieces: Vec<Vec<String>> = Vec::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else {
            return Err(error(item, "a `[` without its `]`"));
        };
        pieces.push(vec![rest[..open].to_string()]);
        pieces.push(expand_ranges(item, &rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    pieces.push(vec![rest.to_string()]);
    let count = pieces
        .iter()
        .try_fold(1usize, |n, p| n.checked_mul(p.len()))
        .filter(|&n| n.saturating_add(hosts.len()) <= MAX_HOSTS)
        .ok_or_else(|| error(item, format!("expands to more than {MAX_HOSTS} hosts")))?;
    hosts.reserve(count);
    let mut index = vec![0usize; pieces.len()];
    for _ in 0..count {
        hosts.push(
            pieces
                .iter()
                .zip(&index)
                .map(|(p, &i)| p[i].as_str())
                .collect(),
        );
        // The last group varies fastest, as in Slurm.
        for (i, piece) in index.iter_mut().zip(&pieces).rev() {
            *i += 1;
            if *i < piece.len() {
                break;
            }
            *i = 0;
        }
    }
    Ok(())
}

/// The inside of one bracket: `01-04,07`.
fn expand_ranges(item: &str, inside: &str) -> Result<Vec<String>, NotationError> {
    let mut out = Vec::new();
    for range in inside.split(',') {
        let (lo_text, hi_text) = range.split_once('-').unwrap_or((range, range));
        let number = |text: &str| -> Result<u64, NotationError> {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error(
                    item,
                    format!("[{inside}]: {range:?} is not a number or a range lo-hi"),
                ));
            }
            text.parse()
                .map_err(|_| error(item, format!("[{inside}]: {text} is too large")))
        };
        let (lo, hi) = (number(lo_text)?, number(hi_text)?);
        if hi < lo {
            return Err(error(
                item,
                format!("[{inside}]: the range {range} runs backwards"),
            ));
        }
        if hi - lo >= MAX_HOSTS as u64 || out.len() + (hi - lo) as usize >= MAX_HOSTS {
            return Err(error(
                item,
                format!("expands to more than {MAX_HOSTS} hosts"),
            ));
        }
        // Zero-padded to the width of `lo` as written, as Slurm does.
        let width = lo_text.len();
        out.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Expands `SLURM_TASKS_PER_NODE`'s notation (`2(x3),1`) into one count per node.
///
/// # Errors
///
/// [`NotationError`] naming the element that is not `N` or `N(xM)`, or a count or repeat
/// count of 0.
pub fn expand_tasks_per_node(value: &str) -> Result<Vec<u32>, NotationError> {
    let mut counts = Vec::new();
    for part in value.split(',') {
        let (count, times) = match part.split_once("(x") {
            Some((count, rest)) => {
                let times = rest
                    .strip_suffix(')')
                    .ok_or_else(|| error(part, "want N or N(xM)"))?;
                (count, times)
            }
            None => (part, "1"),
        };
        if part.is_empty() {
            return Err(error(part, "an empty entry; want N or N(xM)"));
        }
        let parse = |text: &str| -> Result<u32, NotationError> {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error(part, "want N or N(xM), N and M whole numbers"));
            }
            text.parse()
                .map_err(|_| error(part, format!("{text} is too large")))
        };
        let (count, times) = (parse(count)?, parse(times)?);
        if times == 0 {
            return Err(error(part, "a repeat count of 0"));
        }
        if count == 0 {
            return Err(error(part, "0 tasks on a node"));
        }
        if counts.len() + times as usize > MAX_HOSTS {
            return Err(error(part, format!("more than {MAX_HOSTS} nodes")));
        }
        counts.extend(std::iter::repeat_n(count, times as usize));
    }
    Ok(counts)
}

/// Writes host names back in the compact notation: runs of names that differ only in a
/// trailing number of the same width become one bracket (`n[01-03,07]`). The inverse of
/// [`expand_hostlist`] for any list of names without brackets or commas, order kept (used for
/// `srun --nodelist`, and by the tests).
#[must_use]
pub fn compress_hostlist(hosts: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < hosts.len() {
        let Some((prefix, digits)) = split_number(&hosts[i]) else {
            out.push(hosts[i].clone());
            i += 1;
            continue;
        };
        // The longest run of names with this prefix and width, in order.
        let mut j = i + 1;
        while j < hosts.len()
            && split_number(&hosts[j]).is_some_and(|(p, d)| p == prefix && d.len() == digits.len())
        {
            j += 1;
        }
        if j - i == 1 {
            out.push(hosts[i].clone());
            i = j;
            continue;
        }
        let numbers: Vec<u64> = hosts[i..j]
            .iter()
            .map(|h| split_number(h).map_or(0, |(_, d)| d.parse().unwrap_or(0)))
            .collect();
        let width = digits.len();
        let mut ranges: Vec<String> = Vec::new();
        let mut k = 0;
        while k < numbers.len() {
            let mut end = k;
            while end + 1 < numbers.len() && numbers[end + 1] == numbers[end] + 1 {
                end += 1;
            }
            ranges.push(match end == k {
                true => format!("{:0width$}", numbers[k]),
                false => format!("{:0width$}-{:0width$}", numbers[k], numbers[end]),
            });
            k = end + 1;
        }
        out.push(format!("{prefix}[{}]", ranges.join(",")));
        i = j;
    }
    out.join(",")
}

/// `node07` → (`node`, `07`); `None` without a trailing number, or one too long for a u64.
fn split_number(name: &str) -> Option<(&str, &str)> {
    let at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let digits = &name[at..];
    (!digits.is_empty() && digits.len() < 20).then(|| (&name[..at], digits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap()
    }

    #[test]
    fn ranges_lists_padding_and_suffixes_expand_as_slurm_does() {
        assert_eq!(names("n1"), ["n1"]);
        assert_eq!(names("n[1-3]"), ["n1", "n2", "n3"]);
        assert_eq!(names("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(names("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(names("n[001-2]"), ["n001", "n002"]);
        assert_eq!(
            names("node[01-02,07],gpu-[1-2]a"),
            ["node01", "node02", "node07", "gpu-1a", "gpu-2a"]
        );
        assert_eq!(names("a,b,a"), ["a", "b", "a"]);
        assert_eq!(names("n[1-2],,m"), ["n1", "n2", "m"]);
    }

    #[test]
    fn several_brackets_expand_as_a_product_the_last_fastest() {
        assert_eq!(names("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(names("[1-2]x"), ["1x", "2x"]);
    }

    #[test]
    fn a_malformed_list_names_the_offending_part() {
        for (list, part, why) in [
            ("n[1-3", "n[1-3", "without its `]`"),
            ("n1-3]", "n1-3]", "without its `[`"),
            ("n[3-1]", "n[3-1]", "runs backwards"),
            ("n[a-2],m", "n[a-2]", "not a number"),
            ("n[]", "n[]", "not a number"),
            (",", ",", "no host"),
            ("n[[1]]", "n[[1]]", "inside a bracket"),
            ("n[1-99999999]", "n[1-99999999]", "more than"),
            ("n[1-2000]m[1-2000]", "n[1-2000]m[1-2000]", "more than"),
        ] {
            let e = expand_hostlist(list).unwrap_err();
            assert_eq!(e.part, part, "{list}: {e}");
            assert!(e.why.contains(why), "{list}: {e}");
        }
    }

    #[test]
    fn tasks_per_node_repeats_expand_and_bad_ones_are_named() {
        assert_eq!(expand_tasks_per_node("4").unwrap(), [4]);
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("1,8(x2)").unwrap(), [1, 8, 8]);
        for (value, part) in [
            ("2(x3", "2(x3"),
            ("2,x", "x"),
            ("2(x0)", "2(x0)"),
            ("0(x3)", "0(x3)"),
            ("2,0", "0"),
            ("", ""),
            ("3(y2)", "3(y2)"),
        ] {
            let e = expand_tasks_per_node(value).unwrap_err();
            assert_eq!(e.part, part, "{value}: {e}");
        }
    }

    /// A host name of the kinds clusters use: letters, digits, dashes, dots.
    fn plain_name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9.-]{0,6}[a-z]"
    }

    proptest! {
        #[test]
        fn compressing_then_expanding_gives_the_names_back(
            hosts in proptest::collection::vec(
                (plain_name(), 0u64..200, 1usize..4, any::<bool>()).prop_map(
                    |(p, n, w, numbered)| if numbered { format!("{p}{n:0w$}") } else { p }
                ),
                1..40,
            )
        ) {
            let list = compress_hostlist(&hosts);
            prop_assert_eq!(expand_hostlist(&list).unwrap(), hosts);
        }

        #[test]
        fn a_range_expands_to_its_count_with_its_width(
            prefix in plain_name(), lo in 0u64..500, span in 0u64..300, width in 1usize..5
        ) {
            let list = format!("{prefix}[{lo:0width$}-{:0width$}]", lo + span);
            let hosts = expand_hostlist(&list).unwrap();
            prop_assert_eq!(hosts.len() as u64, span + 1);
            for (k, h) in hosts.iter().enumerate() {
                let n = lo + k as u64;
                prop_assert_eq!(h, &format!("{prefix}{n:0width$}"));
            }
        }

        #[test]
        fn hostile_text_is_an_error_or_names_never_a_panic(text in "[a-z0-9\\[\\],-]{0,30}") {
            let _ = expand_hostlist(&text);
            let _ = expand_tasks_per_node(&text);
        }

        #[test]
        fn tasks_per_node_repeats_add_up(
            parts in proptest::collection::vec((1u32..64, 1u32..20, any::<bool>()), 1..10)
        ) {
            let text: Vec<String> = parts.iter().map(|&(n, m, rep)| match rep {
                true => format!("{n}(x{m})"),
                false => n.to_string(),
            }).collect();
            let counts = expand_tasks_per_node(&text.join(",")).unwrap();
            let want: Vec<u32> = parts.iter().flat_map(|&(n, m, rep)| {
                std::iter::repeat_n(n, if rep { m as usize } else { 1 })
            }).collect();
            prop_assert_eq!(counts, want);
        }
    }
}
