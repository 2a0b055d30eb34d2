from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'trainjob.yaml.j2'

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
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'trainjob.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    yield 'apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'metadata'), environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'metadata')), 2))
    yield '\nspec:\n  runtimeRef:\n    name: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'runtime')))
    yield '\n    apiGroup: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'group')))
    yield '\n    kind: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'runtime_kind')))
    yield '\n  trainer:\n    image: '
    yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'container'), 'image')))
    yield '\n    command: '
    yield str(t_2(environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'container'), 'command')))
    yield '\n    env:\n      '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'env'), environment.getattr(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'container'), 'env')), 6))
    yield '\n    numNodes: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'nodes')))
    yield '\n    numProcPerNode: '
    yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'procs_per_node')))
    yield '\n'
    if environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'resources_per_node'):
        pass
        yield '    resourcesPerNode: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'resources_per_node')))
        yield '\n'
    if environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'suspend'):
        pass
        yield '  suspend: true\n'
    if (not t_3(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'deadline'))):
        pass
        yield '  activeDeadlineSeconds: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'deadline')))
        yield '\n'
    if (not t_3(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'patch_pod'))):
        pass
        yield '  runtimePatches:\n    - manager: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'patch_manager')))
        yield '\n      trainingRuntimeSpec:\n        template:\n          spec:\n            replicatedJobs:\n              - name: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'node')))
        yield '\n                template:\n                  spec:\n                    template: '
        yield str(t_2(environment.getattr((undefined(name='job') if l_0_job is missing else l_0_job), 'patch_pod')))
        yield '\n'

blocks = {}
debug_info = '7=31&11=34&14=36&15=38&16=40&18=42&19=44&21=46&22=48&23=50&24=52&25=55&27=57&30=60&31=63&33=65&35=68&40=70&43=72'