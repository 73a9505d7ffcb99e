package main

// An answer is what the model used for one request.
type answer struct{ promptTokens, answerTokens int }

func (a answer) used() int { return a.promptTokens + a.answerTokens }

// complete stands in for the model: it answers every prompt with three
// tokens per prompt token, never more than the request's MaxTokens, so a
// run is the same every time.
func complete(r chatRequest) answer {
	return answer{promptTokens: r.PromptTokens, answerTokens: min(3*r.PromptTokens, r.MaxTokens)}
}
