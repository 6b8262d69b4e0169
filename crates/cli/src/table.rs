//! Tables as kubectl prints them: a header row, no borders, each column as wide as its widest
//! cell and three spaces between columns (comfy-table sizes the columns).

use comfy_table::{Cell, Table, presets};

/// A table with `header`; add rows, then `render` it.
pub fn new<I: IntoIterator<Item = T>, T: Into<Cell>>(header: I) -> Table {
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header(header);
    table
}

/// The table's lines, each indented by `indent` spaces, trailing spaces trimmed.
pub fn render(mut table: Table, indent: usize) -> String {
    // The first column sits at the indent; every other column three spaces after the last.
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((if i == 0 { 0 } else { 3 }, 0));
    }
    let mut out = String::new();
    for line in table.lines() {
        out.push_str(&" ".repeat(indent));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = super::new(["NAME", "PHASE"]);
        t.add_row(["a-long-cluster-name", "Ready"]);
        t.add_row(["b", "Established"]);
        assert_eq!(
            super::render(t, 2),
            "  NAME                  PHASE\n  a-long-cluster-name   Ready\n  b                     Established\n"
        );
    }
}
