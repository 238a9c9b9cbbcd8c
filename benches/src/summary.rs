//! The closing table: each benchmark's headline figure beside its goal
//! (DESIGN.md "What fast means here") and the anchors' published figures.

/// One headline figure.
pub struct Row {
    /// What was measured.
    pub what: String,
    /// Our figure, formatted.
    pub ours: String,
    /// The goal, if DESIGN.md sets one.
    pub goal: Option<String>,
    /// Whether the goal was met, if there is one.
    pub met: Option<bool>,
    /// What users would pick instead, and its figure (published, or
    /// measured in the same run).
    pub anchor: Option<String>,
}

/// The rows gathered so far.
#[derive(Default)]
pub struct Summary {
    rows: Vec<Row>,
}

impl Summary {
    /// Adds a figure without a goal.
    pub fn figure(
        &mut self,
        what: impl Into<String>,
        ours: impl Into<String>,
        anchor: Option<&'static str>,
    ) {
        self.rows.push(Row {
            what: what.into(),
            ours: ours.into(),
            goal: None,
            met: None,
            anchor: anchor.map(Into::into),
        });
    }

    /// Adds a figure beside an anchor measured in the same run.
    pub fn measured_anchor(
        &mut self,
        what: impl Into<String>,
        ours: impl Into<String>,
        anchor: String,
    ) {
        self.rows.push(Row {
            what: what.into(),
            ours: ours.into(),
            goal: None,
            met: None,
            anchor: Some(anchor),
        });
    }

    /// Adds a figure against a goal.
    pub fn goal(
        &mut self,
        what: impl Into<String>,
        ours: impl Into<String>,
        goal: impl Into<String>,
        met: bool,
        anchor: Option<&'static str>,
    ) {
        self.rows.push(Row {
            what: what.into(),
            ours: ours.into(),
            goal: Some(goal.into()),
            met: Some(met),
            anchor: anchor.map(Into::into),
        });
    }

    /// Prints the table (markdown).
    pub fn print(&self) {
        if self.rows.is_empty() {
            return;
        }
        println!("\n## Summary");
        println!("| what | peerwasm | goal | anchor |");
        println!("|---|---|---|---|");
        for r in &self.rows {
            let goal = match (&r.goal, r.met) {
                (Some(g), Some(true)) => format!("{g} — met"),
                (Some(g), Some(false)) => format!("{g} — **not met**"),
                (Some(g), None) => g.clone(),
                (None, _) => String::new(),
            };
            println!(
                "| {} | {} | {} | {} |",
                r.what,
                r.ours,
                goal,
                r.anchor.as_deref().unwrap_or("")
            );
        }
    }
}
