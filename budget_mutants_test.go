package admit_test

// Script mutants of the Budget API (issue 9): TestMutants runs them with
// the others, and admittest's budget rules must catch each one. They are
// kept in their own file, appended to scriptMutants, so that changes to the
// older mutants and to these merge apart.

func init() { scriptMutants = append(scriptMutants, budgetMutants...) }

var budgetMutants = []mutant{
	{name: "cost-ignored-on-second-bucket",
		edits: [][2]string{{"local c2 = tonumber(ARGV[9])", "local c2 = 1"}}},
	{name: "retry-until-one-token-not-cost",
		edits: [][2]string{{"(tonumber(ARGV[4 * i + 1]) - tk)", "(1 - tk)"}}},
	{name: "refund-above-burst",
		edits: [][2]string{{"tk = math.min(burst, tk + tonumber(ARGV[4 * i + 1]))", "tk = tk + tonumber(ARGV[4 * i + 1])"}}},
	{name: "refund-creates-absent-key",
		edits: [][2]string{{"    if tokens[i] ~= nil then\n      store(i, tk, ts)\n    end\n", "    store(i, tk, ts)\n"}}},
	{name: "peek-writes",
		edits: [][2]string{{"local write = mode == 't'", "local write = mode ~= 'r'"}}},
	{name: "remaining-off-by-cost",
		edits: [][2]string{{"return reply(0, 0, tk1 - c1, tk2 - c2)", "return reply(0, 0, tk1 - c1, tk2)"}}},
	{name: "remaining-off-by-cost-one-bucket",
		edits: [][2]string{{"return reply(0, 0, tk1 - c1, -1)", "return reply(0, 0, tk1, -1)"}}},
	{name: "remaining-off-by-cost-on-second-denial",
		edits: [][2]string{{"return reply(2, wait(2, tk2, ts2), tk1 - c1, tk2)", "return reply(2, wait(2, tk2, ts2), tk1, tk2)"}}},
}
