package admit_test

// Script mutants of the Budget API (issue 9): TestMutants runs them with
// the others, and admittest's budget rules must catch each one. They are
// kept in their own file, appended to scriptMutants, so that changes to the
// older mutants and to these merge apart.

func init() { scriptMutants = append(scriptMutants, budgetMutants...) }

var budgetMutants = []mutant{
	{name: "cost-ignored-on-second-bucket", // a take decides and charges bucket 2 at cost 1
		edits: [][2]string{
			{"elseif n == 2 and tk2 < c2 then", "elseif n == 2 and tk2 < 1 then"},
			{"tk1, tk2 = tk1 - c1, tk2 - c2", "tk1, tk2 = tk1 - c1, tk2 - 1"},
		}},
	{name: "retry-until-one-token-not-cost",
		edits: [][2]string{
			{"ts1 + (c1 - tk1) * per1 - now", "ts1 + (1 - tk1) * per1 - now"},
			{"ts2 + (c2 - tk2) * per2 - now", "ts2 + (1 - tk2) * per2 - now"},
		}},
	{name: "refund-above-burst",
		edits: [][2]string{
			{"tk1 = math.min(max1, tk1 + c1)", "tk1 = tk1 + c1"},
			{"tk2 = math.min(max2, tk2 + c2)", "tk2 = tk2 + c2"},
		}},
	{name: "refund-creates-absent-key",
		edits: [][2]string{
			{"how1 = not new1 and STORE or nil", "how1 = STORE"},
			{"how2 = not new2 and STORE or nil", "how2 = STORE"},
		}},
	{name: "peek-writes",
		edits: [][2]string{{"if mode == 't' or mode == 'o' or mode == 'r' then", "if mode == 't' or mode == 'o' or mode == 'r' or mode == 'p' then"}}},
	{name: "remaining-off-by-cost",
		edits: [][2]string{{"fmt, x, y = '0 0 %d %d', tk1, tk2", "fmt, x, y = '0 0 %d %d', tk1, tk2 + c2"}}},
	{name: "remaining-off-by-cost-one-bucket",
		edits: [][2]string{{"fmt, x = '0 0 %d -1', tk1", "fmt, x = '0 0 %d -1', tk1 + c1"}}},
	{name: "remaining-off-by-cost-on-second-denial",
		edits: [][2]string{{"ts2 + (c2 - tk2) * per2 - now, tk1, tk2", "ts2 + (c2 - tk2) * per2 - now, tk1 + c1, tk2"}}},
}
