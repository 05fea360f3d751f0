"""Oracle: ANLS as the DocVQA / InfographicVQA evaluation scripts compute it, ported literally.

Source: EvolvingLMMs-Lab/lmms-eval, ``lmms_eval/api/metrics.py`` (``levenshtein_distance`` and ``anls``), commit
75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3, which names its own source as Qwen-VL's
``eval_mm/infographicsvqa_eval.py`` (the DocVQA / InfographicVQA script). Licence: MIT (lmms-eval's LICENSE).
Changes: the ``register_metric`` decorator and the nested-list unwrapping of ``predictions`` removed; the value is
returned as a number. Nothing of qvl is imported.
"""

# ruff: noqa


def levenshtein_distance(s1, s2):
    if len(s1) > len(s2):
        s1, s2 = s2, s1

    distances = range(len(s1) + 1)
    for i2, c2 in enumerate(s2):
        distances_ = [i2 + 1]
        for i1, c1 in enumerate(s1):
            if c1 == c2:
                distances_.append(distances[i1])
            else:
                distances_.append(1 + min((distances[i1], distances[i1 + 1], distances_[-1])))
        distances = distances_
    return distances[-1]


def anls(references, predictions, thresh_hold=0.5):
    values = []
    pred = predictions[0]

    for answer in references:
        # preprocess both the answers - gt and prediction
        gt_answer = " ".join(answer.strip().lower().split())
        det_answer = " ".join(pred.strip().lower().split())

        dist = levenshtein_distance(gt_answer, det_answer)
        length = max(len(answer.upper()), len(pred.upper()))
        values.append(0.0 if length == 0 else float(dist) / float(length))

    question_result = 1 - min(values)

    if question_result < thresh_hold:
        question_result = 0
    return question_result
