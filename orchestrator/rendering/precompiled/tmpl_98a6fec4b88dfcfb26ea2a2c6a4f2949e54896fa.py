from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'trainingruntime.yaml.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_runtime = resolve('runtime')
    l_0_parts = missing
    try:
        t_1 = environment.filters['indent']
    except KeyError:
        @internalcode
        def t_1(*unused):
            raise TemplateRuntimeError("No filter named 'indent' found.")
    try:
        t_2 = environment.filters['tojson']
    except KeyError:
        @internalcode
        def t_2(*unused):
            raise TemplateRuntimeError("No filter named 'tojson' found.")
    try:
        t_3 = environment.tests['none']
    except KeyError:
        @internalcode
        def t_3(*unused):
            raise TemplateRuntimeError("No test named 'none' found.")
    pass
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'trainingruntime.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    yield 'apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainingRuntime\nmetadata:\n  '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'metadata'), environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'metadata')), 2))
    yield '\nspec:\n  mlPolicy:\n    numNodes: '
    yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'nodes')))
    yield '\n    torch: {}\n'
    if environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'gang'):
        pass
        yield '  podGroupPolicy:\n    '
        yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'gang')))
        yield ': {}\n'
    yield '  template:\n    spec:\n      replicatedJobs:\n        - name: '
    yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'node')))
    yield '\n          replicas: 1\n          template:\n            metadata:\n              labels: '
    yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'ancestor_label')))
    yield '\n            spec:\n              backoffLimit: '
    yield str(t_2(environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'backoff_limit')))
    yield '\n'
    if environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'pod_failure_rules'):
        pass
        yield '              podFailurePolicy:\n                rules: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'pod_failure_rules')))
        yield '\n'
    yield '              template: '
    yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'pod_template')))
    yield '\n'
    if environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'jobset_rules'):
        pass
        yield '      failurePolicy:\n'
        if (not t_3(environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'max_restarts'))):
            pass
            yield '        maxRestarts: '
            yield str(t_2(environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'max_restarts')))
            yield '\n'
        yield '        rules: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'restart'), 'jobset_rules')))
        yield '\n'
    if environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'template_annotations'):
        pass
        yield '    metadata:\n      annotations: '
        yield str(t_2(environment.getattr((undefined(name='runtime') if l_0_runtime is missing else l_0_runtime), 'template_annotations')))
        yield '\n'

blocks = {}
debug_info = '8=31&12=34&15=36&17=38&19=41&25=44&29=46&31=48&32=50&34=53&36=56&37=58&39=61&40=64&42=67&44=69&46=72'