from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'pytorchjob.yaml.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_job = resolve('job')
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
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'pytorchjob.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    yield 'apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'metadata'), environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'metadata')), 2))
    yield '\nspec:\n  nprocPerNode: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'nproc_per_node')))
    yield '\n  runPolicy:\n    cleanPodPolicy: "Running"\n    backoffLimit: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'backoff_limit')))
    yield '\n'
    if (not t_3(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'deadline'))):
        pass
        yield '    activeDeadlineSeconds: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'deadline')))
        yield '\n'
    if (not t_3(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'ttl_after_finished'))):
        pass
        yield '    ttlSecondsAfterFinished: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'ttl_after_finished')))
        yield '\n'
    if environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'):
        pass
        yield '    schedulingPolicy:\n      minAvailable: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'), 'min_available')))
        yield '\n'
        if environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'), 'queue'):
            pass
            yield '      queue: '
            yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'), 'queue')))
            yield '\n'
        if environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'), 'priority_class'):
            pass
            yield '      priorityClass: '
            yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'gang'), 'priority_class')))
            yield '\n'
    if environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'suspend'):
        pass
        yield '    suspend: true\n'
    if environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'elastic'):
        pass
        yield '  elasticPolicy:\n    rdzvBackend: "c10d"\n    minReplicas: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'elastic'), 'min_replicas')))
        yield '\n    maxReplicas: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'elastic'), 'max_replicas')))
        yield '\n    maxRestarts: '
        yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'elastic'), 'max_restarts')))
        yield '\n'
    yield '  pytorchReplicaSpecs:\n'
    for l_1_replica in environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'replicas'):
        _loop_vars = {}
        pass
        yield '    '
        yield str(t_2(environment.getattr(l_1_replica, 'type')))
        yield ':\n      replicas: '
        yield str(t_2(environment.getattr(l_1_replica, 'count')))
        yield '\n      restartPolicy: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'restart_policy')))
        yield '\n      template: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'pod_template')))
        yield '\n'
    l_1_replica = missing

blocks = {}
debug_info = '9=31&13=34&15=36&19=38&20=40&21=43&23=45&24=48&26=50&28=53&29=55&30=58&32=60&33=63&36=65&39=68&42=71&43=73&44=75&47=78&48=82&49=84&50=86&51=88'