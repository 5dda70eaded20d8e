//! A static tree of Zygotes, as OpenLambda's `import_cache_tree`: a JSON file of nodes
//! `{"packages": ["name==version", ...], "children": [...]}`, each node holding its own
//! packages and its ancestors'. The worker installs every node's packages and has the import
//! cache make the tree at start; its Zygotes are never evicted.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sprout_sandbox::import_cache::StaticNode;

use super::requirements;
use super::Packages;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeNode {
    #[serde(default)]
    pub packages: Vec<String>,
    #[serde(default)]
    pub children: Vec<TreeNode>,
}

/// Read a tree file. Its root may list packages too (a Zygote below the root Zygote).
pub fn load(path: &Path) -> Result<TreeNode> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the Zygote tree {}", path.display()))?;
    let tree: TreeNode = serde_json::from_str(&text).with_context(|| format!("parsing the Zygote tree {}", path.display()))?;
    fn check(node: &TreeNode, depth: usize) -> Result<()> {
        if depth > 16 {
            bail!("the Zygote tree is deeper than 16 levels");
        }
        node.children.iter().try_for_each(|c| check(c, depth + 1))
    }
    check(&tree, 0)?;
    Ok(tree)
}

/// Install the packages of every node and describe the tree for the import cache (the root
/// Zygote itself is implied: nodes with no packages of their own are skipped over).
pub async fn resolve(tree: &TreeNode, packages: &Packages) -> Result<Vec<StaticNode>> {
    let mut out = Vec::new();
    let mut stack: Vec<(&TreeNode, Vec<String>, Vec<usize>)> = vec![(tree, Vec::new(), Vec::new())];
    // Build depth-first, recording each node's place as a path of child indexes in `out`.
    while let Some((node, inherited, place)) = stack.pop() {
        let mut lines = inherited.clone();
        lines.extend(node.packages.iter().cloned());
        let mut place = place;
        if !node.packages.is_empty() {
            let reqs = requirements::parse(&lines.join("\n"), packages.allow_unpinned())
                .with_context(|| format!("in the Zygote tree node {:?}", node.packages))?;
            let set =
                packages.prepare(&reqs).await.map_err(|e| anyhow::anyhow!("installing {:?} for the Zygote tree: {e}", node.packages))?;
            let made = StaticNode { packages: set.packages.clone(), children: Vec::new() };
            let siblings = place.iter().fold(&mut out, |level: &mut Vec<StaticNode>, i| &mut level[*i].children);
            siblings.push(made);
            place.push(siblings.len() - 1);
        }
        for child in node.children.iter().rev() {
            stack.push((child, lines.clone(), place.clone()));
        }
    }
    Ok(out)
}
