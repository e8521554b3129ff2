//! Cost across an agent tree (SPEC.md "Agent tool"): each run's direct cost, and its cumulative
//! cost (its own plus every descendant's). Exact integer sums, so a root's cumulative cost equals
//! the sum of every direct cost in its tree whatever order the runs arrive in.

use std::collections::HashMap;

/// One run of a tree: its id, its parent (none for the root) and its direct cost in credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRun<'a> {
    pub id: &'a str,
    pub parent: Option<&'a str>,
    pub direct: i64,
}

/// Direct and cumulative credits of every run of a set of trees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeTotals {
    cumulative: HashMap<String, i64>,
    direct: HashMap<String, i64>,
}

impl TreeTotals {
    /// Totals of `runs`. A run whose parent is not among them counts as a root; a parent chain
    /// that loops (corrupt data) is cut where it repeats, so every cost is still counted once per
    /// ancestor at most.
    pub fn new(runs: &[TreeRun<'_>]) -> TreeTotals {
        let parent: HashMap<&str, &str> = runs
            .iter()
            .filter_map(|r| r.parent.map(|p| (r.id, p)))
            .collect();
        let known: HashMap<&str, i64> = runs.iter().map(|r| (r.id, r.direct)).collect();
        let mut cumulative: HashMap<String, i64> = HashMap::with_capacity(runs.len());
        for run in runs {
            // Walk up from the run, adding its direct cost to itself and each ancestor.
            let mut seen: Vec<&str> = Vec::new();
            let mut at = Some(run.id);
            while let Some(id) = at {
                if seen.contains(&id) || !known.contains_key(id) {
                    break;
                }
                seen.push(id);
                let total = cumulative.entry(id.to_string()).or_insert(0);
                *total = total.saturating_add(run.direct);
                at = parent.get(id).copied();
            }
        }
        TreeTotals {
            cumulative,
            direct: known.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    /// The run's own model calls.
    pub fn direct(&self, id: &str) -> i64 {
        self.direct.get(id).copied().unwrap_or(0)
    }

    /// The run and everything beneath it.
    pub fn cumulative(&self, id: &str) -> i64 {
        self.cumulative.get(id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_three_level_tree() {
        let runs = [
            TreeRun {
                id: "root",
                parent: None,
                direct: 10,
            },
            TreeRun {
                id: "a",
                parent: Some("root"),
                direct: 5,
            },
            TreeRun {
                id: "b",
                parent: Some("root"),
                direct: 7,
            },
            TreeRun {
                id: "a1",
                parent: Some("a"),
                direct: 3,
            },
        ];
        let totals = TreeTotals::new(&runs);
        assert_eq!(totals.cumulative("root"), 25);
        assert_eq!(totals.cumulative("a"), 8);
        assert_eq!(totals.cumulative("b"), 7);
        assert_eq!(totals.cumulative("a1"), 3);
        assert_eq!(totals.direct("a"), 5);
        assert_eq!(totals.cumulative("missing"), 0);
    }

    #[test]
    fn a_looping_parent_chain_is_counted_once() {
        let runs = [
            TreeRun {
                id: "x",
                parent: Some("y"),
                direct: 1,
            },
            TreeRun {
                id: "y",
                parent: Some("x"),
                direct: 2,
            },
        ];
        let totals = TreeTotals::new(&runs);
        assert_eq!(totals.cumulative("x"), 3);
        assert_eq!(totals.cumulative("y"), 3);
    }

    /// A random tree: run `i > 0` has a parent among the runs before it.
    fn tree() -> impl Strategy<Value = Vec<(usize, i64)>> {
        prop::collection::vec((any::<prop::sample::Index>(), 0i64..1_000_000_000), 1..60).prop_map(
            |nodes| {
                nodes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (parent, cost))| (if i == 0 { 0 } else { parent.index(i) }, cost))
                    .collect()
            },
        )
    }

    proptest! {
        #[test]
        fn parts_sum_to_totals(nodes in tree(), shuffle_seed in any::<u64>()) {
            let ids: Vec<String> = (0..nodes.len()).map(|i| format!("r{i}")).collect();
            let mut runs: Vec<TreeRun<'_>> = nodes
                .iter()
                .enumerate()
                .map(|(i, &(parent, direct))| TreeRun {
                    id: &ids[i],
                    parent: (i > 0).then(|| ids[parent].as_str()),
                    direct,
                })
                .collect();
            // Arrival order must not matter.
            let len = runs.len();
            for i in 0..len {
                let j = (shuffle_seed as usize).wrapping_mul(i + 1) % len;
                runs.swap(i, j);
            }
            let totals = TreeTotals::new(&runs);
            let all: i64 = nodes.iter().map(|n| n.1).sum();
            prop_assert_eq!(totals.cumulative("r0"), all);
            // Every run's cumulative cost is its own plus its children's cumulative costs.
            for (i, id) in ids.iter().enumerate() {
                let children: i64 = (1..nodes.len())
                    .filter(|&c| nodes[c].0 == i)
                    .map(|c| totals.cumulative(&ids[c]))
                    .sum();
                prop_assert_eq!(totals.cumulative(id), nodes[i].1 + children);
            }
        }
    }
}
