import workload


class WordCount:
    def __init__(self, context):
        pass

    def predict(self, inputs):
        return {"score": [workload.text_score(inputs["text"][0].decode())]}
